"""Per-model metrics against moto: deploy creates the log group, the metric filters, the dashboard and
the alarms with the documented names, dimensions and namespace (real-time, multi-model, inference
components); --delete removes them and keeps the logs; --no-model-metrics creates none; the IAM
permissions the docs list are the calls the code makes."""

from __future__ import annotations

import json
import re

import pytest

from scripts.sagemaker import deploy
from scripts.sagemaker.model_metrics import NAMESPACE
from tests.support import PROJECT_ROOT, deploy_argv, params

TOPIC = "arn:aws:sns:us-east-1:123456789012:model-alarms"
GROUP = "/aws/sagemaker/Endpoints/mm"
SHIPPED = ("bert_base", "resnet", "yolov5")
METRICS = (
    "ConstrainedRequests",
    "Detections",
    "GeneratedTokens",
    "GenerationTokensPerSecond",
    "Invocation4XXErrors",
    "Invocation5XXErrors",
    "Invocations",
    "Latency",
    "Masks",
    "TimeToFirstToken",
    "ToolCalls",
    "TritonLatency",
)
OPERATING = PROJECT_ROOT / "docs" / "operating.md"


def run(clients, *argv: str) -> int:
    return deploy.main(list(argv), clients=clients, sleep=lambda s: None)


def filters_on(clients, group: str) -> dict[str, dict]:
    found = clients.logs.describe_metric_filters(logGroupName=group)["metricFilters"]
    return {f["filterName"]: f for f in found}


def alarms_of(clients, endpoint: str = "mm") -> dict[str, dict]:
    found = clients.cloudwatch.describe_alarms(AlarmNamePrefix=f"{endpoint}/")["MetricAlarms"]
    return {a["AlarmName"]: a for a in found}


def dashboard_of(clients, endpoint: str = "mm") -> dict:
    return json.loads(clients.cloudwatch.get_dashboard(DashboardName=f"{endpoint}-per-model")["DashboardBody"])


def dimensions(metric: dict) -> dict[str, str]:
    return {d["Name"]: d["Value"] for d in metric["Dimensions"]}


def test_a_real_time_deploy_creates_filters_dashboard_and_alarms(sent, capsys):
    clients, calls = sent
    argv = deploy_argv(
        "--alarm-topic", TOPIC, "--alarm-p99-ms", "500", "--alarm-p99-ms", "bert_base=900", "--alarm-5xx-percent", "2"
    )
    assert run(clients, *argv) == 0

    # The container is told its endpoint's name: the access lines' `endpoint`, the EndpointName dimension.
    assert params(calls, "CreateModel")["PrimaryContainer"]["Environment"]["ENDPOINT_NAME"] == "mm"
    # The log group exists before the endpoint does, with the default retention.
    order = [name for name, _ in calls]
    assert order.index("CreateLogGroup") < order.index("PutMetricFilter") < order.index("CreateEndpoint")
    (group,) = clients.logs.describe_log_groups(logGroupNamePrefix=GROUP)["logGroups"]
    assert group["logGroupName"] == GROUP and group["retentionInDays"] == 30

    filters = filters_on(clients, GROUP)
    assert sorted(filters) == [f"mm/{m}" for m in METRICS]
    for name, found in filters.items():
        (transformation,) = found["metricTransformations"]
        assert transformation["metricNamespace"] == NAMESPACE
        assert transformation["metricName"] == name.removeprefix("mm/")
        assert transformation["dimensions"] == {"EndpointName": "$.endpoint", "Model": "$.model"}
        assert found["filterPattern"].startswith('{ $.logger = "app.access" && $.method = "POST"')
    assert filters["mm/Invocation5XXErrors"]["filterPattern"].endswith("&& $.status >= 500 }")
    assert filters["mm/Latency"]["metricTransformations"][0]["metricValue"] == "$.duration_ms"
    assert filters["mm/TritonLatency"]["metricTransformations"][0]["metricValue"] == "$.triton_ms"

    alarms = alarms_of(clients)
    assert sorted(alarms) == sorted(f"mm/{m}/{kind}" for m in SHIPPED for kind in ("5xx-rate", "p99-latency"))
    p99 = alarms["mm/resnet/p99-latency"]
    assert (p99["Namespace"], p99["MetricName"], p99["ExtendedStatistic"]) == (NAMESPACE, "Latency", "p99")
    assert dimensions(p99) == {"EndpointName": "mm", "Model": "resnet"}
    assert p99["Threshold"] == 500.0 and alarms["mm/bert_base/p99-latency"]["Threshold"] == 900.0
    assert p99["EvaluateLowSampleCountPercentile"] == "ignore" and p99["TreatMissingData"] == "notBreaching"
    rate = alarms["mm/yolov5/5xx-rate"]
    assert rate["Threshold"] == 2.0 and rate["AlarmActions"] == [TOPIC] and rate["OKActions"] == [TOPIC]
    stats = {m["Id"]: m for m in rate["Metrics"]}
    assert stats["rate"]["Expression"] == "100 * FILL(errors, 0) / invocations"
    assert dimensions(stats["errors"]["MetricStat"]["Metric"]) == {"EndpointName": "mm", "Model": "yolov5"}

    body = dashboard_of(clients)
    assert body["widgets"][0]["type"] == "text"
    shown = {tuple(row[:2]) for w in body["widgets"][1:] for row in w["properties"]["metrics"]}
    assert (NAMESPACE, "Latency") in shown and ("AWS/SageMaker", "ModelLatency") in shown
    assert ("/aws/sagemaker/Endpoints", "GPUUtilization") in shown
    out = capsys.readouterr().out
    assert f"log group {GROUP}: created, retention 30 days" in out
    assert "12 metric filters, dashboard mm-per-model, 6 alarms, notifying " + TOPIC in out


def test_a_multi_model_endpoint_takes_the_model_from_target_model(sent):
    clients, _ = sent
    argv = deploy_argv(
        "--metrics-models", "resnet,bert_base", models=("--multi-model", "s3://models-bucket/per-model/")
    )
    assert run(clients, *argv) == 0
    filters = filters_on(clients, GROUP)
    for found in filters.values():
        assert found["metricTransformations"][0]["dimensions"]["Model"] == "$.target_model"
        assert '$.path != "/models"' in found["filterPattern"] and "$.target_model = *" in found["filterPattern"]
    assert sorted(alarms_of(clients)) == sorted(
        f"mm/{m}.tar.gz/{kind}" for m in ("resnet", "bert_base") for kind in ("5xx-rate", "p99-latency")
    )
    shown = {tuple(row[:2]) for w in dashboard_of(clients)["widgets"][1:] for row in w["properties"]["metrics"]}
    assert ("AWS/SageMaker", "ModelCacheHit") in shown and ("/aws/sagemaker/Endpoints", "LoadedModelCount") in shown


def test_an_existing_log_group_keeps_its_retention_unless_one_is_given(sent, capsys):
    clients, _ = sent
    clients.logs.create_log_group(logGroupName=GROUP)
    clients.logs.put_retention_policy(logGroupName=GROUP, retentionInDays=365)
    assert run(clients, *deploy_argv("--no-scaling")) == 0
    assert clients.logs.describe_log_groups(logGroupNamePrefix=GROUP)["logGroups"][0]["retentionInDays"] == 365
    assert "exists, retention unchanged" in capsys.readouterr().out
    assert run(clients, "--name", "mm", "--delete") == 0
    assert run(clients, *deploy_argv("--no-scaling", "--log-retention-days", "7")) == 0
    assert clients.logs.describe_log_groups(logGroupNamePrefix=GROUP)["logGroups"][0]["retentionInDays"] == 7


def test_delete_removes_filters_dashboard_and_alarms_and_keeps_the_logs(sent, capsys):
    clients, _ = sent
    assert run(clients, *deploy_argv()) == 0
    # Another endpoint whose name starts with this one's keeps everything.
    assert run(clients, *[("mm-2" if a == "mm" else a) for a in deploy_argv("--no-scaling")]) == 0
    assert run(clients, "--name", "mm", "--delete") == 0

    assert filters_on(clients, GROUP) == {} and alarms_of(clients) == {}
    names = [d["DashboardName"] for d in clients.cloudwatch.list_dashboards()["DashboardEntries"]]
    assert names == ["mm-2-per-model"]
    assert clients.logs.describe_log_groups(logGroupNamePrefix=GROUP + "")["logGroups"][0]["logGroupName"] == GROUP
    assert (
        len(filters_on(clients, "/aws/sagemaker/Endpoints/mm-2")) == len(METRICS)
        and len(alarms_of(clients, "mm-2")) == 6
    )
    out = capsys.readouterr().out
    assert "deleted 6 per-model alarms" in out and "deleted dashboard mm-per-model" in out
    assert f"deleted 12 metric filters on {GROUP} (the log group and its logs are kept)" in out
    assert run(clients, "--name", "mm", "--delete") == 0  # again: nothing left, no error


def test_turned_off_nothing_is_created(sent, capsys):
    clients, calls = sent
    assert run(clients, *deploy_argv("--no-model-metrics")) == 0
    made = {name for name, _ in calls}
    assert not made & {"CreateLogGroup", "PutRetentionPolicy", "PutMetricFilter", "PutDashboard", "PutMetricAlarm"}
    assert clients.logs.describe_log_groups()["logGroups"] == []
    assert clients.cloudwatch.list_dashboards()["DashboardEntries"] == []
    assert "per-model metrics: off (--no-model-metrics)" in capsys.readouterr().out
    assert params(calls, "CreateModel")["PrimaryContainer"]["Environment"]["ENDPOINT_NAME"] == "mm"


def test_no_alarms_keeps_the_filters_and_the_dashboard(sent):
    clients, _ = sent
    assert run(clients, *deploy_argv("--no-alarms")) == 0
    assert len(filters_on(clients, GROUP)) == len(METRICS) and alarms_of(clients) == {}
    assert dashboard_of(clients)["widgets"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--env", "ENDPOINT_NAME=other"), "deploy sets it to the endpoint's name (mm)"),
        (("--alarm-p99-ms", "fast"), "expected MS or NAME=MS"),
        (("--alarm-5xx-percent", "0"), "outside (0, 100]"),
        (("--log-retention-days", "10"), "invalid choice: 10"),
    ],
)
def test_bad_metric_flags_are_refused_before_any_call(sent, capsys, argv, message):
    clients, calls = sent
    with pytest.raises(SystemExit) as exit_:
        run(clients, *deploy_argv(*argv))
    assert exit_.value.code == 2 and message in capsys.readouterr().err and calls == []


def documented_permissions() -> set[str]:
    """The IAM actions docs/operating.md lists for the per-model metrics."""
    section = OPERATING.read_text().split("## Per-model metrics in CloudWatch", 1)[1].split("\n## ", 1)[0]
    block = section.split("IAM permissions", 1)[1]
    return set(re.findall(r"`((?:logs|cloudwatch):[A-Za-z]+)`", block))


def test_the_documented_iam_permissions_are_the_calls_made(sent):
    clients, _ = sent
    prefixes = {clients.logs: "logs", clients.cloudwatch: "cloudwatch"}
    actions: set[str] = set()
    for client, prefix in prefixes.items():
        client.meta.events.register(
            "provide-client-params.*.*", lambda model, prefix=prefix, **_: actions.add(f"{prefix}:{model.name}")
        )
    # Every path: a deploy that creates the log group, one that finds it, --delete.
    assert run(clients, *deploy_argv("--no-scaling", "--alarm-topic", TOPIC)) == 0
    assert run(clients, "--name", "mm", "--delete") == 0
    assert run(clients, *deploy_argv("--no-scaling", "--log-retention-days", "14")) == 0
    assert actions == documented_permissions()
