"""Create and remove an endpoint's per-model metrics in AWS: the log group(s), the metric filters,
the dashboard and the alarms that ``scripts/sagemaker/model_metrics.py`` and
``scripts/sagemaker/dashboard.py`` describe.

The log group: SageMaker creates ``/aws/sagemaker/Endpoints/<endpoint>`` only when the endpoint's
first instance logs, and a metric filter needs its log group to exist. CloudWatch Logs lets anyone
with ``logs:CreateLogGroup`` create it first, and SageMaker then writes its streams into it; so
deploy creates it (with a retention) before the endpoint, and the filters count the very first
lines. Deleting the endpoint removes the filters, the dashboard and the alarms, and keeps the log
group: the logs outlive the endpoint until their retention ends them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from scripts.sagemaker.dashboard import dashboard_body, dashboard_name
from scripts.sagemaker.model_metrics import (
    DEFAULT_RETENTION_DAYS,
    REAL_TIME,
    MetricsConfig,
    alarm_prefix,
    alarms,
    filter_name,
    log_groups,
    metric_filters,
)
from scripts.sagemaker.resources import Clients, Log

COMPONENT_GROUPS = "/aws/sagemaker/InferenceComponents/"
ALARMS_PER_CALL = 100  # DeleteAlarms takes at most 100 names


def _ensure_log_group(logs, group: str, retention_days: int | None) -> str:
    """Create ``group`` unless it exists; set its retention when created, or when one is given."""
    try:
        logs.create_log_group(logGroupName=group)
    except logs.exceptions.ResourceAlreadyExistsException:
        if retention_days is None:
            return "exists, retention unchanged"
        logs.put_retention_policy(logGroupName=group, retentionInDays=retention_days)
        return f"exists, retention {retention_days} days"
    days = retention_days or DEFAULT_RETENTION_DAYS
    logs.put_retention_policy(logGroupName=group, retentionInDays=days)
    return f"created, retention {days} days"


def create(
    clients: Clients,
    endpoint: str,
    form: str,
    config: MetricsConfig | None,
    region: str,
    components: Sequence[str] = (),
    log: Log = print,
) -> dict[str, list[str]]:
    """The log groups, filters, dashboard and alarms for ``endpoint`` (``config`` None: none); what
    was made, by kind."""
    if config is None:
        log("  per-model metrics: off (--no-model-metrics)")
        return {}
    groups = log_groups(endpoint, form, components)
    for group in groups:
        log(f"  log group {group}: {_ensure_log_group(clients.logs, group, config.retention_days)}")
    filters = metric_filters(endpoint, form, components, config.namespace)
    for params in filters:
        clients.logs.put_metric_filter(**params)
    name = dashboard_name(endpoint)
    clients.cloudwatch.put_dashboard(
        DashboardName=name, DashboardBody=json.dumps(dashboard_body(endpoint, form, config, region, components))
    )
    made = alarms(endpoint, config)
    for alarm in made:
        clients.cloudwatch.put_metric_alarm(**alarm)
    models = ", ".join(config.models) or "none named"
    notify = f", notifying {config.alarms.topic_arn}" if config.alarms and config.alarms.topic_arn else ""
    log(
        f"  per-model metrics in {config.namespace} (models: {models}): {len(filters)} metric filters, "
        f"dashboard {name}, {len(made)} alarms{notify}"
    )
    return {
        "log_groups": groups,
        "filters": [f["filterName"] for f in filters],
        "dashboard": [name],
        "alarms": [a["AlarmName"] for a in made],
    }


def _groups_of(logs, endpoint: str) -> list[str]:
    """The endpoint's log group and its inference components' (``<endpoint>-<model>``)."""
    groups = log_groups(endpoint, REAL_TIME)
    paginator = logs.get_paginator("describe_log_groups")
    for page in paginator.paginate(logGroupNamePrefix=f"{COMPONENT_GROUPS}{endpoint}-"):
        groups += [g["logGroupName"] for g in page.get("logGroups", [])]
    return groups


def remove(clients: Clients, endpoint: str, log: Log = print) -> None:
    """Delete the alarms, the dashboard and the metric filters made for ``endpoint``; keep its logs."""
    cw, logs = clients.cloudwatch, clients.logs
    names = [
        alarm["AlarmName"]
        for page in cw.get_paginator("describe_alarms").paginate(AlarmNamePrefix=alarm_prefix(endpoint))
        for alarm in page.get("MetricAlarms", [])
    ]
    for start in range(0, len(names), ALARMS_PER_CALL):
        cw.delete_alarms(AlarmNames=names[start : start + ALARMS_PER_CALL])
    if names:
        log(f"deleted {len(names)} per-model alarms")
    name = dashboard_name(endpoint)
    listed = cw.list_dashboards(DashboardNamePrefix=name).get("DashboardEntries", [])
    if any(entry["DashboardName"] == name for entry in listed):
        cw.delete_dashboards(DashboardNames=[name])
        log(f"deleted dashboard {name}")
    prefix = filter_name(endpoint, "")
    for group in _groups_of(logs, endpoint):
        try:
            found = [
                f["filterName"]
                for page in logs.get_paginator("describe_metric_filters").paginate(
                    logGroupName=group, filterNamePrefix=prefix
                )
                for f in page.get("metricFilters", [])
            ]
        except logs.exceptions.ResourceNotFoundException:
            continue
        for filter_ in found:
            logs.delete_metric_filter(logGroupName=group, filterName=filter_)
        if found:
            log(f"deleted {len(found)} metric filters on {group} (the log group and its logs are kept)")
