"""Application Auto Scaling for an endpoint's variant or an inference component, and its removal.

A real-time endpoint tracks SageMakerVariantInvocationsPerInstance between 1 and N instances.
An inference component scales its copies (sagemaker:inference-component:DesiredCopyCount of
``inference-component/<name>``), tracking SageMakerInferenceComponentInvocationsPerCopy.
An asynchronous endpoint scales down to zero, as AWS documents it ("Autoscale an asynchronous
endpoint"): a target-tracking policy on ApproximateBacklogSizePerInstance (queued requests per
instance), and, since that metric cannot bring back an instance when there are none, a step-scaling
policy that a CloudWatch alarm on HasBacklogWithoutCapacity fires: from 0 to 1 instance.
"""

from __future__ import annotations

from dataclasses import dataclass

from scripts.sagemaker.resources import Clients, Log

VARIANT = "AllTraffic"
SERVICE = "sagemaker"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
COMPONENT_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
COMPONENT_METRIC = "SageMakerInferenceComponentInvocationsPerCopy"
METRIC_NAMESPACE = "AWS/SageMaker"
BACKLOG_METRIC = "ApproximateBacklogSizePerInstance"
NO_CAPACITY_METRIC = "HasBacklogWithoutCapacity"
ALARM_PERIOD_S = 60
ALARM_PERIODS = 2  # two minutes of backlog without an instance fire the alarm


@dataclass(frozen=True)
class ScalingConfig:
    min_capacity: int = 1
    max_capacity: int = 2
    invocations_per_instance: float = 100.0  # real-time: per instance per minute
    invocations_per_copy: float = 100.0  # an inference component: per copy per minute
    backlog_per_instance: float = 5.0  # asynchronous: queued requests per instance
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60


@dataclass(frozen=True)
class Target:
    """What Application Auto Scaling scales: a resource and one of its dimensions."""

    resource_id: str
    dimension: str

    def keys(self) -> dict[str, str]:
        return {"ServiceNamespace": SERVICE, "ResourceId": self.resource_id, "ScalableDimension": self.dimension}


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def variant_target(endpoint: str) -> Target:
    return Target(resource_id(endpoint), SCALABLE_DIMENSION)


def component_target(component: str) -> Target:
    return Target(f"inference-component/{component}", COMPONENT_DIMENSION)


def policy_name(endpoint: str) -> str:
    return f"{endpoint}-invocations-per-instance"


def backlog_policy_name(endpoint: str) -> str:
    return f"{endpoint}-backlog-per-instance"


def from_zero_policy_name(endpoint: str) -> str:
    return f"{endpoint}-scale-out-from-zero"


def alarm_name(endpoint: str) -> str:
    return f"{endpoint}-has-backlog-without-capacity"


def copies_policy_name(component: str) -> str:
    return f"{component}-invocations-per-copy"


def _dimensions(endpoint: str) -> list[dict[str, str]]:
    return [{"Name": "EndpointName", "Value": endpoint}]


def _track(aas, target: Target, name: str, scaling: ScalingConfig, value: float, metric: dict) -> None:
    aas.put_scaling_policy(
        PolicyName=name,
        **target.keys(),
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(value),
            **metric,
            "ScaleInCooldown": scaling.scale_in_cooldown_s,
            "ScaleOutCooldown": scaling.scale_out_cooldown_s,
        },
    )


def configure_scaling(
    clients: Clients, endpoint: str, scaling: ScalingConfig, *, asynchronous: bool = False, log: Log = print
) -> None:
    _register(clients.autoscaling, variant_target(endpoint), scaling)
    if asynchronous:
        _scale_on_backlog(clients, endpoint, scaling, log)
        return
    _track(
        clients.autoscaling,
        variant_target(endpoint),
        policy_name(endpoint),
        scaling,
        scaling.invocations_per_instance,
        {"PredefinedMetricSpecification": {"PredefinedMetricType": METRIC}},
    )
    log(
        f"auto scaling: {scaling.min_capacity}..{scaling.max_capacity} instances, target "
        f"{scaling.invocations_per_instance:g} invocations per instance per minute"
    )


def configure_component_scaling(clients: Clients, component: str, scaling: ScalingConfig, log: Log = print) -> None:
    """An inference component's copies between ``min_capacity`` and ``max_capacity``, tracking
    ``invocations_per_copy`` invocations per copy per minute."""
    target = component_target(component)
    _register(clients.autoscaling, target, scaling)
    _track(
        clients.autoscaling,
        target,
        copies_policy_name(component),
        scaling,
        scaling.invocations_per_copy,
        {"PredefinedMetricSpecification": {"PredefinedMetricType": COMPONENT_METRIC}},
    )
    log(
        f"auto scaling {component}: {scaling.min_capacity}..{scaling.max_capacity} copies, target "
        f"{scaling.invocations_per_copy:g} invocations per copy per minute"
    )


def _register(aas, target: Target, scaling: ScalingConfig) -> None:
    aas.register_scalable_target(**target.keys(), MinCapacity=scaling.min_capacity, MaxCapacity=scaling.max_capacity)


def _scale_on_backlog(clients: Clients, endpoint: str, scaling: ScalingConfig, log: Log) -> None:
    _track(
        clients.autoscaling,
        variant_target(endpoint),
        backlog_policy_name(endpoint),
        scaling,
        scaling.backlog_per_instance,
        {
            "CustomizedMetricSpecification": {
                "MetricName": BACKLOG_METRIC,
                "Namespace": METRIC_NAMESPACE,
                "Dimensions": _dimensions(endpoint),
                "Statistic": "Average",
            }
        },
    )
    step = clients.autoscaling.put_scaling_policy(
        PolicyName=from_zero_policy_name(endpoint),
        **variant_target(endpoint).keys(),
        PolicyType="StepScaling",
        StepScalingPolicyConfiguration={
            "AdjustmentType": "ChangeInCapacity",
            "MetricAggregationType": "Average",
            "Cooldown": scaling.scale_out_cooldown_s,
            "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
        },
    )
    clients.cloudwatch.put_metric_alarm(
        AlarmName=alarm_name(endpoint),
        AlarmDescription=f"{endpoint} has queued requests and no instance: start one",
        Namespace=METRIC_NAMESPACE,
        MetricName=NO_CAPACITY_METRIC,
        Dimensions=_dimensions(endpoint),
        Statistic="Average",
        Period=ALARM_PERIOD_S,
        EvaluationPeriods=ALARM_PERIODS,
        DatapointsToAlarm=ALARM_PERIODS,
        Threshold=1.0,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="missing",
        AlarmActions=[step["PolicyARN"]],
    )
    log(
        f"auto scaling: {scaling.min_capacity}..{scaling.max_capacity} instances, target "
        f"{scaling.backlog_per_instance:g} queued requests per instance; alarm {alarm_name(endpoint)} "
        f"starts one when requests wait and none runs"
    )


def remove_scaling(clients: Clients, endpoint: str, log: Log = print) -> None:
    """Delete the scaling policies, the scalable target and the scale-from-zero alarm, where they exist."""
    remove_target_scaling(clients.autoscaling, resource_id(endpoint), log)
    alarms = clients.cloudwatch.describe_alarms(AlarmNames=[alarm_name(endpoint)])["MetricAlarms"]
    if alarms:
        clients.cloudwatch.delete_alarms(AlarmNames=[a["AlarmName"] for a in alarms])
        log(f"deleted alarm {alarm_name(endpoint)}")


def remove_target_scaling(aas, target: str, log: Log = print) -> None:
    """Delete the scaling policies and the scalable targets of one resource id, where they exist."""
    for policy in aas.describe_scaling_policies(ServiceNamespace=SERVICE, ResourceId=target)["ScalingPolicies"]:
        aas.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=SERVICE,
            ResourceId=target,
            ScalableDimension=policy["ScalableDimension"],
        )
        log(f"deleted scaling policy {policy['PolicyName']}")
    for found in aas.describe_scalable_targets(ServiceNamespace=SERVICE, ResourceIds=[target])["ScalableTargets"]:
        aas.deregister_scalable_target(
            ServiceNamespace=SERVICE, ResourceId=target, ScalableDimension=found["ScalableDimension"]
        )
        log(f"deregistered scalable target {target}")
