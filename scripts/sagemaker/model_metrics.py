"""Each model seen on its own in CloudWatch: metric filters on the router's access lines, alarms per
model, and the Logs Insights queries over the same lines (the dashboard: ``scripts/sagemaker/dashboard.py``).

SageMaker ships the container's standard output to CloudWatch Logs, one log group per endpoint
(``/aws/sagemaker/Endpoints/<endpoint>``; per inference component on an endpoint of inference
components, ``/aws/sagemaker/InferenceComponents/<component>``). The router writes one JSON line per
request there (``app/router/observability.py``, its field names in ``app/core/access.py``). A metric
filter on those lines publishes a metric per model with no code in the serving path: the ``Model``
dimension is the line's ``model`` field (``target_model`` on a multi-model endpoint, the archive the
caller named), ``EndpointName`` the line's ``endpoint`` field, which deploy sets through the
container's ``ENDPOINT_NAME``. CloudWatch takes a dimension's value only from a field of the line.

Names, so that deleting the endpoint finds every one: filters ``<endpoint>/<metric>``, alarms
``<endpoint>/<model>/5xx-rate`` and ``<endpoint>/<model>/p99-latency`` (a SageMaker endpoint's name
has no ``/``, so ``<endpoint>/`` is its own prefix), the dashboard ``<endpoint>-per-model``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core import access

NAMESPACE = "SageMakerTritonRouter"  # the product's own CloudWatch namespace
ENDPOINT_DIMENSION = "EndpointName"
MODEL_DIMENSION = "Model"
PERIOD_S = 60
# An alarm fires when 3 of the last 5 one-minute periods breach its threshold.
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3
DEFAULT_5XX_PERCENT = 5.0
DEFAULT_P99_MS = 2000.0
DEFAULT_RETENTION_DAYS = 30
# What CloudWatch Logs' PutRetentionPolicy accepts.
RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)

REAL_TIME = "real-time"
MULTI_MODEL = "multi-model"
COMPONENTS = "inference-components"
FORMS = (REAL_TIME, MULTI_MODEL, COMPONENTS)


@dataclass(frozen=True)
class MetricSpec:
    """One metric a filter publishes for every model: its name, unit, value and what it selects."""

    name: str
    unit: str
    value: str  # "1" (a count) or the field whose number is the value
    condition: str = ""  # what the line must also hold, beyond being a model's invocation
    description: str = ""


def _field(name: str) -> str:
    return f"$.{name}"


COUNT = "1"
METRICS = (
    MetricSpec("Invocations", "Count", COUNT, "", "requests answered, any status"),
    MetricSpec(
        "Invocation4XXErrors",
        "Count",
        COUNT,
        f"{_field(access.STATUS)} >= 400 && {_field(access.STATUS)} < 500",
        "requests answered 4xx (bad input: the caller's to fix)",
    ),
    MetricSpec(
        "Invocation5XXErrors",
        "Count",
        COUNT,
        f"{_field(access.STATUS)} >= 500",
        "requests answered 5xx (Triton down or hung, a bug)",
    ),
    MetricSpec(
        "Latency",
        "Milliseconds",
        _field(access.DURATION_MS),
        f"{_field(access.DURATION_MS)} >= 0",
        "the request in the router, end to end (duration_ms)",
    ),
    MetricSpec(
        "TritonLatency",
        "Milliseconds",
        _field(access.stage_field("triton")),
        f"{_field(access.stage_field('triton'))} >= 0",
        "the Triton call alone (triton_ms; requests that reached Triton)",
    ),
    MetricSpec(
        "GeneratedTokens",
        "Count",
        _field(access.GENERATED_TOKENS),
        f"{_field(access.GENERATED_TOKENS)} >= 0",
        "tokens a text2text or text_generation model generated (generated_tokens; its Sum a minute / 60: "
        "tokens per second)",
    ),
    MetricSpec(
        "TimeToFirstToken",
        "Seconds",
        _field(access.TIME_TO_FIRST_TOKEN),
        f"{_field(access.TIME_TO_FIRST_TOKEN)} >= 0",
        "a text_generation request's seconds to its first token (time_to_first_token_s; p50 and p99)",
    ),
    MetricSpec(
        "GenerationTokensPerSecond",
        "Count/Second",
        _field(access.TOKENS_PER_SECOND),
        f"{_field(access.TOKENS_PER_SECOND)} >= 0",
        "a text_generation request's tokens per second after its first (tokens_per_second)",
    ),
    MetricSpec(
        "ToolCalls",
        "Count",
        _field(access.TOOL_CALLS),
        f"{_field(access.TOOL_CALLS)} >= 0",
        "tool calls read out of a text_generation model's chat answers (tool_calls)",
    ),
    MetricSpec(
        "ConstrainedRequests",
        "Count",
        _field(access.CONSTRAINED),
        f"{_field(access.CONSTRAINED)} >= 0",
        "text_generation requests whose answer kept to a grammar: a JSON Schema, a regex, a tool call (constrained)",
    ),
    MetricSpec(
        "Detections",
        "Count",
        _field(access.DETECTIONS),
        f"{_field(access.DETECTIONS)} >= 0",
        "detections a zero_shot_object_detection or grounded_segmentation model answered (detections)",
    ),
    MetricSpec(
        "Masks",
        "Count",
        _field(access.MASKS),
        f"{_field(access.MASKS)} >= 0",
        "masks a mask_generation or grounded_segmentation model answered (masks)",
    ),
)
METRIC_NAMES = tuple(m.name for m in METRICS)


def model_field(form: str) -> str:
    """The access-line field the Model dimension comes from."""
    return access.TARGET_MODEL if form == MULTI_MODEL else access.MODEL


def selection(form: str) -> str:
    """The conditions that make an access line one model's invocation on this kind of endpoint:
    ``POST /invocations`` naming a served model; on a multi-model endpoint any POST but a load
    (``POST /models``) that carries SageMaker's TargetModel (``/models/<name>/invoke``)."""
    on_path = (
        f'{_field(access.PATH)} != "/models"' if form == MULTI_MODEL else f'{_field(access.PATH)} = "/invocations"'
    )
    return " && ".join(
        (
            f'{_field(access.LOGGER_FIELD)} = "{access.LOGGER}"',
            f'{_field(access.METHOD)} = "POST"',
            on_path,
            f"{_field(model_field(form))} = *",
            f"{_field(access.ENDPOINT)} = *",
        )
    )


def filter_pattern(form: str, metric: MetricSpec) -> str:
    conditions = selection(form) + (f" && {metric.condition}" if metric.condition else "")
    return "{ " + conditions + " }"


def log_groups(endpoint: str, form: str, components: Sequence[str] = ()) -> list[str]:
    """Where the containers' lines go: the endpoint's log group, or each inference component's."""
    if form == COMPONENTS:
        return [f"/aws/sagemaker/InferenceComponents/{component}" for component in components]
    return [f"/aws/sagemaker/Endpoints/{endpoint}"]


def filter_name(endpoint: str, metric: str) -> str:
    return f"{endpoint}/{metric}"


def metric_filters(
    endpoint: str, form: str, components: Sequence[str] = (), namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """The ``logs.put_metric_filter`` parameters: every metric on every log group."""
    dimensions = {ENDPOINT_DIMENSION: _field(access.ENDPOINT), MODEL_DIMENSION: _field(model_field(form))}
    return [
        {
            "logGroupName": group,
            "filterName": filter_name(endpoint, metric.name),
            "filterPattern": filter_pattern(form, metric),
            "metricTransformations": [
                {
                    "metricName": metric.name,
                    "metricNamespace": namespace,
                    "metricValue": metric.value,
                    "dimensions": dict(dimensions),
                    "unit": metric.unit,
                }
            ],
        }
        for group in log_groups(endpoint, form, components)
        for metric in METRICS
    ]


@dataclass(frozen=True)
class AlarmConfig:
    five_xx_percent: float = DEFAULT_5XX_PERCENT
    p99_ms: float = DEFAULT_P99_MS
    p99_ms_by_model: Mapping[str, float] = field(default_factory=dict)  # model -> ms, over p99_ms
    topic_arn: str | None = None  # SNS topic told when an alarm fires and when it is OK again

    def p99_for(self, model: str) -> float:
        return self.p99_ms_by_model.get(model, self.p99_ms)


@dataclass(frozen=True)
class MetricsConfig:
    """What deploy creates for an endpoint's models (a DeployConfig's ``metrics=None``: nothing)."""

    namespace: str = NAMESPACE
    # None: DEFAULT_RETENTION_DAYS for a log group deploy creates, an existing one's left as it is.
    retention_days: int | None = None
    models: tuple[str, ...] = ()  # the Model dimension's values the dashboard and alarms show
    alarms: AlarmConfig | None = field(default_factory=AlarmConfig)  # None: no alarms


def alarm_prefix(endpoint: str) -> str:
    return f"{endpoint}/"


def model_metric(namespace: str, name: str, endpoint: str, model: str) -> dict[str, Any]:
    """A CloudWatch ``Metric``: one of the filters' metrics for one model."""
    return {
        "Namespace": namespace,
        "MetricName": name,
        "Dimensions": [{"Name": ENDPOINT_DIMENSION, "Value": endpoint}, {"Name": MODEL_DIMENSION, "Value": model}],
    }


def alarms(endpoint: str, config: MetricsConfig) -> list[dict[str, Any]]:
    """The ``cloudwatch.put_metric_alarm`` parameters: per model, the 5xx rate and the p99 latency."""
    if config.alarms is None:
        return []
    settings = config.alarms
    actions = {"AlarmActions": [settings.topic_arn], "OKActions": [settings.topic_arn]} if settings.topic_arn else {}
    common = {
        "ComparisonOperator": "GreaterThanThreshold",
        "EvaluationPeriods": EVALUATION_PERIODS,
        "DatapointsToAlarm": DATAPOINTS_TO_ALARM,
        "TreatMissingData": "notBreaching",  # no traffic is no alarm
        **actions,
    }
    made = []
    for model in config.models:

        def stat(metric_id: str, name: str, model: str = model) -> dict[str, Any]:
            metric = model_metric(config.namespace, name, endpoint, model)
            return {
                "Id": metric_id,
                "MetricStat": {"Metric": metric, "Period": PERIOD_S, "Stat": "Sum"},
                "ReturnData": False,
            }

        made.append(
            {
                "AlarmName": f"{endpoint}/{model}/5xx-rate",
                "AlarmDescription": (
                    f"{model} on endpoint {endpoint}: more than {settings.five_xx_percent:g} % of its "
                    f"requests answered 5xx in {DATAPOINTS_TO_ALARM} of {EVALUATION_PERIODS} minutes"
                ),
                "Metrics": [
                    stat("errors", "Invocation5XXErrors"),
                    stat("invocations", "Invocations"),
                    # A minute with requests and no 5xx has no Invocation5XXErrors value: FILL counts it 0.
                    {
                        "Id": "rate",
                        "Expression": "100 * FILL(errors, 0) / invocations",
                        "Label": "5xx %",
                        "ReturnData": True,
                    },
                ],
                "Threshold": settings.five_xx_percent,
                **common,
            }
        )
        threshold = settings.p99_for(model)
        made.append(
            {
                "AlarmName": f"{endpoint}/{model}/p99-latency",
                "AlarmDescription": (
                    f"{model} on endpoint {endpoint}: p99 latency in the router above {threshold:g} ms "
                    f"in {DATAPOINTS_TO_ALARM} of {EVALUATION_PERIODS} minutes"
                ),
                **model_metric(config.namespace, "Latency", endpoint, model),
                "ExtendedStatistic": "p99",
                "Period": PERIOD_S,
                # A minute of a few requests has no meaningful p99: it neither fires nor clears the alarm.
                "EvaluateLowSampleCountPercentile": "ignore",
                "Threshold": threshold,
                **common,
            }
        )
    return made


# CloudWatch Logs Insights queries over the same lines, for the log group(s) above. Every field
# name is app.core.access's.
_LINES = f'filter {access.LOGGER_FIELD} = "{access.LOGGER}" and ispresent({{model}})'


def insights_queries(form: str) -> dict[str, str]:
    """What an operator runs in Logs Insights: per model counts by status, percentiles, and the
    slowest requests with their request ids (the id to find a request's other lines by)."""
    model = model_field(form)
    lines = _LINES.format(model=model)
    status, duration, triton = access.STATUS, access.DURATION_MS, access.stage_field("triton")
    return {
        "requests per model and status": f"{lines}\n| stats count(*) as requests by {model}, {status}\n| sort requests desc",
        "latency percentiles per model (ms)": (
            f"{lines}\n| stats count(*) as requests, pct({duration}, 50) as p50, pct({duration}, 99) as p99, "
            f"pct({triton}, 50) as triton_p50, pct({triton}, 99) as triton_p99 by {model}"
        ),
        "5xx per model, by minute": f"{lines} and {status} >= 500\n| stats count(*) as errors by {model}, bin(1m)",
        "the slowest requests": (
            f"{lines}\n| sort {duration} desc\n| limit 20\n"
            f"| fields @timestamp, {access.REQUEST_ID}, {model}, {status}, {duration}, {triton}, {access.ERROR}"
        ),
        "one request's lines": f'filter {access.REQUEST_ID} = "REQUEST_ID"\n| sort @timestamp',
    }
