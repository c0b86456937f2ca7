"""The per-model metrics without AWS: the filters read the access line's field names from
app/core/access.py (one source of truth), `python -m scripts.sagemaker metrics` prints what deploy
would create and what each filter makes of log lines, and the docs show what the code makes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from app.core import access
from scripts.sagemaker import metrics_cli, model_metrics
from scripts.sagemaker.model_metrics import COMPONENTS, MULTI_MODEL, REAL_TIME, insights_queries, metric_filters
from tests.support import PROJECT_ROOT

OPERATING = (PROJECT_ROOT / "docs" / "operating.md").read_text()
LINE = {
    "time": "2026-11-24T10:00:00+0000",
    "level": "INFO",
    "logger": "app.access",
    "process": 7,
    "message": "POST /invocations 200",
    "request_id": "r1",
    "method": "POST",
    "path": "/invocations",
    "model": "resnet",
    "status": 200,
    "duration_ms": 12.5,
    "preprocess_ms": 1.0,
    "triton_ms": 10.25,
    "postprocess_ms": 1.0,
    "endpoint": "mm",
}


def test_every_field_a_filter_reads_is_one_the_router_writes():
    written = {
        access.LOGGER_FIELD,
        access.METHOD,
        access.PATH,
        access.MODEL,
        access.STATUS,
        access.DURATION_MS,
        access.TARGET_MODEL,
        access.ENDPOINT,
        access.GENERATED_TOKENS,
        access.TIME_TO_FIRST_TOKEN,
        access.TOKENS_PER_SECOND,
        access.TOOL_CALLS,
        access.CONSTRAINED,
        access.DETECTIONS,
        access.MASKS,
        *(access.stage_field(s) for s in access.STAGES),
    }
    for form in (REAL_TIME, MULTI_MODEL):
        for metric_filter in metric_filters("mm", form):
            text = json.dumps(metric_filter)
            assert set(re.findall(r"\$\.([a-z_]+)", text)) <= written, metric_filter["filterName"]


def test_inference_components_get_the_filters_on_each_component_log_group():
    filters = metric_filters("mm", COMPONENTS, ["mm-resnet", "mm-bert-base"])
    groups = sorted({f["logGroupName"] for f in filters})
    assert groups == ["/aws/sagemaker/InferenceComponents/mm-bert-base", "/aws/sagemaker/InferenceComponents/mm-resnet"]
    assert len(filters) == 2 * len(model_metrics.METRICS)


def test_the_dry_run_prints_what_deploy_would_create(capsys):
    assert (
        metrics_cli.main(["--name", "mm", "--form", "multi-model", "--alarm-topic", "arn:aws:sns:us-east-1:1:t"]) == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["log_groups"] == ["/aws/sagemaker/Endpoints/mm"]
    assert [f["filterName"] for f in document["metric_filters"]] == [f"mm/{m.name}" for m in model_metrics.METRICS]
    assert document["dashboard"]["name"] == "mm-per-model" and document["dashboard"]["body"]["widgets"]
    names = [a["AlarmName"] for a in document["alarms"]]
    assert "mm/bert_base.tar.gz/5xx-rate" in names and "mm/yolov5.tar.gz/p99-latency" in names
    assert document["insights_queries"] == insights_queries(MULTI_MODEL)


def test_the_dry_run_is_a_command_of_its_own():
    done = subprocess.run(
        [sys.executable, "-m", "scripts.sagemaker", "metrics", "--name", "ic", "--form", "inference-components",
         "--component", "resnet", "--no-alarms"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["log_groups"] == ["/aws/sagemaker/InferenceComponents/ic-resnet"] and document["alarms"] == []


def test_lines_show_what_each_filter_selects_and_publishes(tmp_path, capsys):
    lines = tmp_path / "serve.log"
    bad = {**LINE, "request_id": "r2", "status": 400, "duration_ms": 3.0}
    del bad["triton_ms"]
    unknown = {k: v for k, v in {**LINE, "request_id": "r3", "status": 404}.items() if k != "model"}
    ping = {**LINE, "method": "GET", "path": "/ping", "status": 200}
    lines.write_text("\n".join(json.dumps(x) for x in (LINE, bad, unknown, ping)) + "\nnot json\n")
    assert metrics_cli.main(["--name", "mm", "--lines", str(lines)]) == 0
    out = capsys.readouterr().out
    blocks = dict(re.findall(r"^mm/(\w+): .*\n((?:  .*\n)*)", out, re.MULTILINE))
    assert blocks["Invocations"].count("line ") == 2 and "2 of 5 lines" in blocks["Invocations"]
    assert "line 2: Invocation4XXErrors 1 Count (EndpointName=mm, Model=resnet)" in blocks["Invocation4XXErrors"]
    assert "0 of 5 lines" in blocks["Invocation5XXErrors"]
    assert (
        "line 1: Latency 12.5 Milliseconds" in blocks["Latency"]
        and "line 2: Latency 3 Milliseconds" in blocks["Latency"]
    )
    assert "line 1: TritonLatency 10.25 Milliseconds" in blocks["TritonLatency"] and "1 of 5" in blocks["TritonLatency"]


@pytest.mark.parametrize("argv", [["--form", "inference-components"], ["--component", "resnet"]])
def test_components_and_their_form_go_together(argv, capsys):
    with pytest.raises(SystemExit):
        metrics_cli.main(argv)
    assert "--component goes with --form inference-components" in capsys.readouterr().err


def test_the_docs_show_the_queries_and_the_filter_the_code_makes():
    for query in insights_queries(REAL_TIME).values():
        assert f"```text\n{query}\n```" in OPERATING, query
    example = OPERATING.split("as `python -m scripts.sagemaker metrics`\nprints it:\n\n```json\n", 1)[1].split(
        "```", 1
    )[0]
    assert json.loads(example) == metric_filters("mm", REAL_TIME)[0]
    for metric in model_metrics.METRICS:
        assert f"| `{metric.name}` | {metric.unit} |" in OPERATING
    assert f"`{model_metrics.NAMESPACE}`" in OPERATING


def test_the_dry_run_piped_into_head_ends_quietly():
    many = ",".join(f"model{i}" for i in range(300))  # far more than a pipe holds: the writer meets the closed end
    command = [sys.executable, "-m", "scripts.sagemaker", "metrics", "--name", "mm", "--metrics-models", many]
    with subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout.read(10) == b'{\n  "log_g'
        proc.stdout.close()  # what `| head -c 10` does
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0 and "Traceback" not in stderr, stderr


def test_the_dry_run_of_a_deploy_without_metrics_prints_nothing_to_create(capsys):
    assert metrics_cli.main(["--name", "mm", "--no-model-metrics"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["metric_filters"] == [] and document["alarms"] == [] and document["dashboard"] is None
    with pytest.raises(SystemExit):
        metrics_cli.main(["--name", "mm", "--no-model-metrics", "--lines", "serve.log"])
    assert "--no-model-metrics makes none" in capsys.readouterr().err


def answered_line(model: str, duration_ms: float, **fields) -> dict:
    """A 200's access line of ``POST /invocations`` on endpoint mm, with ``fields`` (access's names) added."""
    return {
        access.LOGGER_FIELD: access.LOGGER,
        access.METHOD: "POST",
        access.PATH: "/invocations",
        access.MODEL: model,
        access.ENDPOINT: "mm",
        access.STATUS: 200,
        access.DURATION_MS: duration_ms,
        **fields,
    }


def test_the_generated_tokens_filter_publishes_a_text2text_lines_count_and_nothing_for_other_lines():
    from scripts.sagemaker.filter_pattern import publish

    [tokens] = [f for f in metric_filters("mm", REAL_TIME) if f["filterName"] == "mm/GeneratedTokens"]
    line = answered_line("t5", 41.5, **{access.GENERATED_TOKENS: 17})
    [published] = publish(tokens, json.dumps(line))
    assert published.value == 17 and published.dimensions == {"EndpointName": "mm", "Model": "t5"}
    del line[access.GENERATED_TOKENS]  # a request of another family
    assert publish(tokens, json.dumps(line)) == []


def test_a_streamed_generations_line_publishes_its_time_to_first_token_and_rate():
    from scripts.sagemaker.filter_pattern import publish

    filters = {f["filterName"]: f for f in metric_filters("mm", REAL_TIME)}
    line = answered_line(
        "chat",
        910.0,
        **{access.GENERATED_TOKENS: 64, access.TIME_TO_FIRST_TOKEN: 0.042, access.TOKENS_PER_SECOND: 73.5},
    )
    [first] = publish(filters["mm/TimeToFirstToken"], json.dumps(line))
    [rate] = publish(filters["mm/GenerationTokensPerSecond"], json.dumps(line))
    assert (first.value, rate.value) == (0.042, 73.5) and first.dimensions == {"EndpointName": "mm", "Model": "chat"}
    del line[access.TIME_TO_FIRST_TOKEN], line[access.TOKENS_PER_SECOND]  # a request of another family
    assert publish(filters["mm/TimeToFirstToken"], json.dumps(line)) == []


def test_a_chains_line_publishes_its_detections_and_masks_on_a_multi_model_endpoint():
    from scripts.sagemaker.filter_pattern import publish

    filters = {f["filterName"]: f for f in metric_filters("mm", MULTI_MODEL)}
    line = answered_line("grounded", 120.0, **{access.DETECTIONS: 3, access.MASKS: 3})
    line |= {access.PATH: "/models/grounded/invoke", access.TARGET_MODEL: "grounded.tar.gz"}
    for name in ("mm/Detections", "mm/Masks"):
        [published] = publish(filters[name], json.dumps(line))
        assert published.value == 3 and published.dimensions == {"EndpointName": "mm", "Model": "grounded.tar.gz"}
    del line[access.DETECTIONS]  # SAM's line: masks, no detections
    assert publish(filters["mm/Detections"], json.dumps(line)) == []
    assert publish(filters["mm/Masks"], json.dumps(line))[0].value == 3
