"""Every per-model metric filter against real access lines: a stack (real-time, then multi-model)
answers two models' requests with 200, 400 and, with its Triton stopped (SIGSTOP), 5xx; the lines
the router wrote are read from its log, and each filter deploy would create is applied to each
line with CloudWatch's JSON filter pattern semantics (scripts/sagemaker/filter_pattern.py). The
lines each filter selects and the values it extracts are printed, and must be the expected ones:
counts of 1 for the invocations, the 4xx and the 5xx of each model, the line's own duration_ms and
triton_ms for the latencies; the other lines (a request naming no model, a load, a scrape of /metrics) none."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from scripts.devtools import Stack
from scripts.sagemaker.filter_pattern import publish
from scripts.sagemaker.model_metrics import MULTI_MODEL, NAMESPACE, REAL_TIME, metric_filters
from tests.support import access_lines, b64, noise_image

pytestmark = pytest.mark.integration

ENDPOINT = "metrics-check"
TIMEOUT_S = "3"  # a stopped Triton answers 504 after this
IMAGE = b64(noise_image(96, 72, 3))
GOOD = {"resnet": {"img": IMAGE}, "bert_base": {"text": "Paris is the [MASK] of France."}}
BAD = {"resnet": {"img": "%%%"}, "bert_base": {"text": 7}}


def two_models(repository: Path, target: Path) -> Path:
    for folder in [*repository.glob("resnet*"), repository / "bert_base"]:
        shutil.copytree(folder, target / folder.name)
    return target


def paused(stack: Stack):
    """Triton stopped (SIGSTOP) while the block runs; continued after, whatever happens."""

    class Paused:
        def __enter__(self):
            self.pid = stack.pids()["triton"][0]
            os.kill(self.pid, signal.SIGSTOP)

        def __exit__(self, *exc):
            os.kill(self.pid, signal.SIGCONT)

    return Paused()


def send_all(stack: Stack, post: Callable[[str, str, dict], requests.Response]) -> dict[str, tuple[str, int]]:
    """For each model a 200 and a 400, then with Triton stopped a 5xx: request id -> (model, status)."""
    sent: dict[str, tuple[str, int]] = {}

    def one(model: str, kind: str, payload: dict, expected: range) -> None:
        rid = f"{model}-{kind}"
        r = post(model, rid, payload)
        assert r.status_code in expected, (rid, r.status_code, r.text[:300])
        sent[rid] = (model, r.status_code)

    for model, payload in GOOD.items():
        one(model, "ok", payload, range(200, 201))
        one(model, "bad", BAD[model], range(400, 500))
    with paused(stack):
        for model, payload in GOOD.items():
            one(model, "down", payload, range(500, 600))
    return sent


def check(form: str, lines: dict[str, str], sent: dict[str, tuple[str, int]], dimension: Callable[[str], str]) -> None:
    """Each filter's selection and values, printed and compared with what was sent."""
    filters = metric_filters(ENDPOINT, form)
    assert {f["metricTransformations"][0]["metricNamespace"] for f in filters} == {NAMESPACE}
    for metric_filter in filters:
        metric = metric_filter["metricTransformations"][0]["metricName"]
        print(f"\n{metric_filter['filterName']}  {metric_filter['filterPattern']}")
        got: dict[str, tuple[float, dict]] = {}
        for rid, raw in sorted(lines.items()):
            for published in publish(metric_filter, raw):
                got[rid] = (published.value, published.dimensions)
                print(f"  {rid:<18} {published.value:>9g} {published.unit}  {published.dimensions}")
        expected: dict[str, tuple[float, dict]] = {}
        for rid, (model, status) in sent.items():
            line = json.loads(lines[rid])
            dims = {"EndpointName": ENDPOINT, "Model": dimension(model)}
            value = {
                "Invocations": 1.0,
                "Invocation4XXErrors": 1.0 if 400 <= status < 500 else None,
                "Invocation5XXErrors": 1.0 if status >= 500 else None,
                "Latency": line["duration_ms"],
                "TritonLatency": line.get("triton_ms"),
                # generation models only: none here
                "GeneratedTokens": line.get("generated_tokens"),
                "TimeToFirstToken": line.get("time_to_first_token_s"),
                "GenerationTokensPerSecond": line.get("tokens_per_second"),
                "ToolCalls": line.get("tool_calls"),
                "ConstrainedRequests": line.get("constrained"),
                # the prompted families only: none here (tests/integration/test_grounded_segmentation.py)
                "Detections": line.get("detections"),
                "Masks": line.get("masks"),
            }[metric]
            if value is not None:
                expected[rid] = (value, dims)
        assert got == expected, metric
    # The 200s and 5xx reached Triton (a triton_ms); the 400s were refused before it.
    triton = {rid for rid in sent if "triton_ms" in json.loads(lines[rid])}
    assert triton == {rid for rid, (_, status) in sent.items() if status == 200 or status >= 500}


def test_real_time_filters_select_the_expected_lines(repository: Path, tmp_path: Path, new_stack):
    stack = new_stack(
        two_models(repository, tmp_path / "repository"), ENDPOINT_NAME=ENDPOINT, TRITON_TIMEOUT_S=TIMEOUT_S
    )
    stack.wait_healthy(timeout=180)

    def post(model: str, rid: str, payload: dict) -> requests.Response:
        body = {"modelname": model, "payload": payload}
        return requests.post(f"{stack.url}/invocations", json=body, headers={"X-Request-Id": rid}, timeout=60)

    sent = send_all(stack, post)
    # Lines no filter may select: a request naming no served model, a scrape of /metrics.
    unknown = requests.post(
        f"{stack.url}/invocations",
        json={"modelname": "vgg", "payload": {}},
        headers={"X-Request-Id": "no-model"},
        timeout=30,
    )
    assert unknown.status_code == 404
    assert requests.get(f"{stack.url}/metrics", headers={"X-Request-Id": "a-scrape"}, timeout=30).status_code == 200
    lines = access_lines(stack, {*sent, "no-model", "a-scrape"})
    check(REAL_TIME, lines, sent, dimension=lambda model: model)


def test_multi_model_filters_select_the_expected_lines(repository: Path, tmp_path: Path, new_stack):
    (tmp_path / "empty").mkdir()
    stack = new_stack(
        tmp_path / "empty",
        SAGEMAKER_MULTI_MODEL="true",
        MULTI_MODEL_DIR=str(tmp_path / "state"),
        ENDPOINT_NAME=ENDPOINT,
        TRITON_TIMEOUT_S=TIMEOUT_S,
    )
    stack.wait_healthy(timeout=180)
    # Each model's folder as SageMaker extracts its archive; SageMaker names the loaded model itself.
    urls = {"resnet": tmp_path / "resnet" / "model", "bert_base": tmp_path / "bert" / "model"}
    for folder in repository.glob("resnet*"):
        shutil.copytree(folder, urls["resnet"] / folder.name)
    shutil.copytree(repository / "bert_base", urls["bert_base"])  # its config.pbtxt at the top
    loads = {}
    for model, url in urls.items():
        loads[model] = f"load-{model}"
        r = requests.post(
            f"{stack.url}/models",
            json={"model_name": f"h{model}", "url": str(url)},
            # Were SageMaker to send its TargetModel on a load, the filters still leave the load out.
            headers={"X-Request-Id": loads[model], "X-Amzn-SageMaker-Target-Model": f"{model}.tar.gz"},
            timeout=180,
        )
        assert r.status_code == 200, r.text

    def post(model: str, rid: str, payload: dict) -> requests.Response:
        headers = {"X-Request-Id": rid, "X-Amzn-SageMaker-Target-Model": f"{model}.tar.gz"}
        return requests.post(
            f"{stack.url}/models/h{model}/invoke", json={"payload": payload}, headers=headers, timeout=60
        )

    sent = send_all(stack, post)
    lines = access_lines(stack, {*sent, *loads.values()})
    check(MULTI_MODEL, lines, sent, dimension=lambda model: f"{model}.tar.gz")
