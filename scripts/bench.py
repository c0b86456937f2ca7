"""Benchmark: the product against the model-only ceiling and Triton's own SageMaker front end.

Against a running stack (``make run``: NGINX on :8080, Triton gRPC on 127.0.0.1:8001), for each
model and each concurrency, in one run and interleaved (several short rounds; in each round every
side runs one short step, in an order that rotates from round to round) so that machine drift
hits all sides alike:

- ``A-json`` / ``A-raw``: the product through the public port, JSON envelope with a base64 image
  (or text), and the raw body with the model in the custom-attributes header;
- ``B``: the model-only ceiling, Triton over gRPC with the already preprocessed tensor (a minimal
  client: one protobuf request built once, one channel, threads);
- ``C-json`` / ``C-binary``: the peer, Triton's own SageMaker front end, in a second Triton the
  benchmark starts on the same repository with ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` naming the
  model (the only way that front end picks its model), fed the preprocessed tensor as KServe v2
  JSON, and as ``application/vnd.sagemaker-triton.binary+json`` with binary outputs requested;
- ``B-nobatch`` (resnet): the same ceiling on a copy of the model without dynamic batching,
  served by that second Triton.

A trivial model (``identity``: echoes its token ids, no model work) measures the router's own
cost: the benchmark writes it into ``build/bench/``, starts its own ``serve`` on that repository
(with the three models beside it) on free ports, and compares A with B there. That stack also gives
the start-to-``/ping`` time and a router worker's resident memory after the run.

Writes ``build/bench/results.json`` and PNG plots into ``build/bench/``; prints every figure of
the targets table with its target and a pass / fall-short mark. ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from app.core.settings import PROJECT_ROOT as ROOT

DEFAULT_OUT = ROOT / "build" / "bench"
DEFAULT_IMAGE = ROOT / "build" / "samples" / "dog.jpg"
DEFAULT_TEXT = "The capital of France is [MASK]."
IDENTITY_TEXT = "hello [MASK] world."
MODELS = ("resnet", "yolov5", "bert_base")
CONCURRENCY = (1, 4, 8, 16)
IDENTITY = "identity"
NOBATCH_SUFFIX = "_nobatch"
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
START_TIMEOUT_S = 300.0


# --------------------------------------------------------------------------------------------
# Pure parts: statistics, the interleaving schedule, the targets table.
# --------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's
    default); NaN for no values."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Cell:
    """Everything measured for one (model, side, concurrency), over all rounds."""

    latencies_s: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    seconds: float = 0.0  # the measured windows, added up
    work: float = 0.0  # requests done within those windows
    first_error: str = ""

    def add(self, latencies_s: Sequence[float], errors: int, seconds: float, work: float,
            first_error: str = "") -> None:
        self.latencies_s.extend(latencies_s)
        self.ok += len(latencies_s)
        self.errors += errors
        self.seconds += seconds
        self.work += work
        self.first_error = self.first_error or first_error

    def summary(self) -> dict[str, Any]:
        ms = [s * 1000.0 for s in self.latencies_s]
        return {
            "throughput": self.work / self.seconds if self.seconds > 0 else 0.0,
            "p50_ms": percentile(ms, 50),
            "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99),
            "requests": self.ok,
            "errors": self.errors,
            "seconds": self.seconds,
            "first_error": self.first_error,
        }


@dataclass(frozen=True)
class Step:
    model: str
    side: str
    concurrency: int
    round: int


def schedule(models: Sequence[str], sides: Mapping[str, Sequence[str]], concurrencies: Sequence[int],
             rounds: int) -> list[Step]:
    """The order of the steps: model by model (the peer serves one model at a time), then round
    by round, concurrency by concurrency, and within that every side of the model once, the order
    of the sides rotated by one each round so no side is always first after a change."""
    steps = []
    for model in models:
        model_sides = list(sides[model])
        for r in range(rounds):
            for i, concurrency in enumerate(concurrencies):
                shift = (r + i) % len(model_sides) if model_sides else 0
                for side in model_sides[shift:] + model_sides[:shift]:
                    steps.append(Step(model, side, concurrency, r))
    return steps


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | None  # None: not measured in this run
    target: str  # ">= 0.90", "<= 1.0 ms"
    unit: str = ""

    @property
    def passed(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        op, bound = self.target.split()[:2]
        return self.value >= float(bound) if op == ">=" else self.value <= float(bound)

    @property
    def mark(self) -> str:
        return {True: "pass", False: "falls short", None: "not measured"}[self.passed]


def _get(results: Mapping, model: str, side: str, concurrency: int, key: str) -> float | None:
    value = results.get(model, {}).get(side, {}).get(str(concurrency), {}).get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def target_figures(results: Mapping, extras: Mapping[str, float | None] | None = None) -> list[Figure]:
    """The issue's targets table from ``results[model][side][str(concurrency)]`` summaries.

    ``extras``: ``start_to_ping_s`` and ``worker_rss_mb`` when measured."""
    extras = extras or {}
    figures = []
    for model in MODELS:
        for a_side in ("A-raw", "A-json"):
            figures.append(Figure(
                f"{a_side} / B throughput, c=8, {model}",
                _ratio(_get(results, model, a_side, 8, "throughput"), _get(results, model, "B", 8, "throughput")),
                ">= 0.90"))
    for peer, target in (("C-json", ">= 1.0"), ("C-binary", ">= 0.90")):
        for model in ("resnet", "bert_base"):
            figures.append(Figure(
                f"A-raw / {peer} throughput, c=8, {model}",
                _ratio(_get(results, model, "A-raw", 8, "throughput"), _get(results, model, peer, 8, "throughput")),
                target))
    a, b = _get(results, IDENTITY, "A-raw", 1, "p50_ms"), _get(results, IDENTITY, "B", 1, "p50_ms")
    figures.append(Figure(f"router's own latency, A-raw p50 - B p50, c=1, {IDENTITY}",
                          a - b if a is not None and b is not None else None, "<= 1.0 ms", " ms"))
    figures.append(Figure(
        "dynamic batching on / off throughput (B), c=16, resnet",
        _ratio(_get(results, "resnet", "B", 16, "throughput"),
               _get(results, "resnet", "B-nobatch", 16, "throughput")),
        ">= 1.3"))
    figures.append(Figure(
        "raw body / base64 JSON throughput, c=8, resnet",
        _ratio(_get(results, "resnet", "A-raw", 8, "throughput"), _get(results, "resnet", "A-json", 8, "throughput")),
        ">= 1.0"))
    figures.append(Figure("serve start to /ping 200 (the benchmarked models + identity)", extras.get("start_to_ping_s"),
                          "<= 20 s", " s"))
    figures.append(Figure("resident memory of one router worker after the mixed requests", extras.get("worker_rss_mb"),
                          "<= 300 MB", " MB"))
    return figures


def format_figures(figures: Iterable[Figure]) -> str:
    rows = [("figure", "value", "target", "mark")]
    for f in figures:
        value = "-" if f.passed is None else (f"{f.value:.2f}{f.unit}" if f.unit else f"{f.value:.3f}")
        rows.append((f.name, value, f.target, f.mark))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_results(results: Mapping) -> str:
    rows = [("model", "side", "c", "req/s", "p50 ms", "p95 ms", "p99 ms", "requests", "errors")]
    for model, sides in results.items():
        for side, by_c in sides.items():
            for c, s in by_c.items():
                rows.append((model, side, c, f"{s['throughput']:.1f}", f"{s['p50_ms']:.1f}", f"{s['p95_ms']:.1f}",
                             f"{s['p99_ms']:.1f}", str(s["requests"]), str(s["errors"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


# --------------------------------------------------------------------------------------------
# Requests: what each side sends, built once.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpRequest:
    host: str
    port: int
    path: str
    body: bytes
    headers: Mapping[str, str]


def preprocessed_tensors(spec: Any, image: Path, text: str) -> dict[str, Any]:
    """The tensors the router would send for this sample, made here with numpy (the model's cost
    does not depend on the values; the shapes and dtypes are the spec's)."""
    import numpy as np
    from PIL import Image

    if spec.family == "fill_mask":
        from tokenizers import BertWordPieceTokenizer

        length = int(spec.preprocess.get("sequence_length", spec.inputs[0].dims[-1]))
        tokenizer = BertWordPieceTokenizer(str(spec.file(spec.preprocess["vocab"])),
                                           lowercase=bool(spec.preprocess.get("lowercase", True)))
        ids = tokenizer.encode(text).ids[:length]
        arrays = [np.zeros(length, np.int64), np.zeros(length, np.int64), np.zeros(length, np.int64)]
        arrays[0][: len(ids)] = ids
        arrays[1][: len(ids)] = 1
    else:
        with Image.open(image) as im:
            rgb = im.convert("RGB")
        if spec.family == "image_classification":
            resize, crop = int(spec.preprocess["resize"]), int(spec.preprocess["crop"])
            w, h = rgb.size
            scale = resize / min(w, h)
            rgb = rgb.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
            left, top = (rgb.width - crop) // 2, (rgb.height - crop) // 2
            x = np.asarray(rgb.crop((left, top, left + crop, top + crop)), np.float32) / 255.0
            x = (x - np.array(spec.preprocess["mean"], np.float32)) / np.array(spec.preprocess["std"], np.float32)
        else:  # detection: letterbox
            size = int(spec.preprocess["size"])
            ratio = size / max(rgb.size)
            resized = rgb.resize((round(rgb.width * ratio), round(rgb.height * ratio)), Image.BILINEAR)
            canvas = Image.new("RGB", (size, size), tuple(spec.preprocess.get("pad_color", (114, 114, 114))))
            canvas.paste(resized, ((size - resized.width) // 2, (size - resized.height) // 2))
            x = np.asarray(canvas, np.float32) * float(spec.preprocess.get("scale", 1 / 255))
        arrays = [np.ascontiguousarray(x.transpose(2, 0, 1))]
    return {t.name: a.astype(t.numpy_dtype)[None] for t, a in zip(spec.inputs, arrays)}


def product_requests(model: str, family: str, host: str, port: int, image: bytes, text: str) -> dict[str, HttpRequest]:
    """A-json and A-raw for one model."""
    if family == "fill_mask":
        payload: dict[str, Any] = {"text": text}
        raw, raw_type = text.encode(), "text/plain; charset=utf-8"
    else:
        payload = {"img": base64.b64encode(image).decode("ascii")}
        raw, raw_type = image, "image/jpeg"
    envelope = json.dumps({"modelname": model, "payload": payload}).encode()
    return {
        "A-json": HttpRequest(host, port, "/invocations", envelope, {"Content-Type": "application/json"}),
        "A-raw": HttpRequest(host, port, "/invocations", raw,
                             {"Content-Type": raw_type, CUSTOM_ATTRIBUTES: f"modelname={model}"}),
    }


def _triton_datatype(array: Any) -> str:
    from app.core.spec import TRITON_TO_NUMPY

    return next(name for name, dtype in TRITON_TO_NUMPY.items() if dtype == array.dtype)


def peer_requests(host: str, port: int, tensors: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, HttpRequest]:
    """C-json (KServe v2 JSON) and C-binary (binary tensor extension, binary outputs) for the peer."""
    as_json = {
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": _triton_datatype(a), "data": a.ravel().tolist()}
                   for n, a in tensors.items()],
        "outputs": [{"name": o} for o in outputs],
    }
    header = json.dumps({
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": _triton_datatype(a),
                    "parameters": {"binary_data_size": a.nbytes}} for n, a in tensors.items()],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }).encode()
    binary = header + b"".join(a.tobytes() for a in tensors.values())
    return {
        "C-json": HttpRequest(host, port, "/invocations", json.dumps(as_json).encode(),
                              {"Content-Type": "application/json"}),
        "C-binary": HttpRequest(host, port, "/invocations", binary, {"Content-Type": f"{BINARY_JSON}{len(header)}"}),
    }


def grpc_request(model: str, tensors: Mapping[str, Any], outputs: Sequence[str]) -> Any:
    """One ModelInferRequest, built once and sent as is by every B call."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in tensors.items():
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, _triton_datatype(array)
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(array.tobytes())
    for name in outputs:
        request.outputs.add().name = name
    return request


# --------------------------------------------------------------------------------------------
# Load: a closed loop of `concurrency` threads for a fixed time.
# --------------------------------------------------------------------------------------------


class HttpCaller:
    """One keep-alive connection per thread; a non-2xx answer is an error."""

    def __init__(self, request: HttpRequest, timeout_s: float) -> None:
        self.request = request
        self.timeout_s = timeout_s
        self.local = threading.local()

    def __call__(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.request.host, self.request.port,
                                                                timeout=self.timeout_s)
        r = self.request
        try:
            conn.request("POST", r.path, body=r.body, headers=r.headers)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise
        if not 200 <= response.status < 300:
            raise RuntimeError(f"HTTP {response.status}: {body[:200].decode(errors='replace')}")


class GrpcCaller:
    """The ceiling's client: one channel, the prebuilt request, no per-call Python work."""

    def __init__(self, url: str, request: Any, timeout_s: float) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.channel = grpc.insecure_channel(url, options=[("grpc.max_send_message_length", -1),
                                                           ("grpc.max_receive_message_length", -1)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.request = request
        self.timeout_s = timeout_s

    def __call__(self) -> None:
        self.stub.ModelInfer(self.request, timeout=self.timeout_s)

    def close(self) -> None:
        self.channel.close()


def window_work(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Requests done inside [start, end]: each request counts for the share of its own duration
    that falls inside the window. With every thread busy all along, this is the steady-state
    throughput times the window, free of the ramp-down after the deadline (calls still in flight
    then are waited for, and their latencies kept, but only their share inside counts)."""
    done = 0.0
    for began, ended in spans:
        took = ended - began
        if took <= 0:
            done += 1.0 if start <= ended <= end else 0.0
            continue
        done += max(0.0, min(ended, end) - max(began, start)) / took
    return done


@dataclass(frozen=True)
class Load:
    latencies_s: list[float]
    errors: int
    window_s: float
    work: float  # requests done within the window (window_work)
    first_error: str = ""


def run_load(call: Callable[[], None], concurrency: int, seconds: float) -> Load:
    """A closed loop of ``concurrency`` threads calling ``call`` for ``seconds``."""
    spans: list[list[tuple[float, float]]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    first_error: list[str] = []
    start_gate = threading.Barrier(concurrency + 1)
    window = [0.0, 0.0]

    def worker(i: int) -> None:
        start_gate.wait()
        mine = spans[i]
        while time.perf_counter() < window[1]:
            began = time.perf_counter()
            try:
                call()
            except Exception as error:  # counted and reported, the load goes on
                errors[i] += 1
                if not first_error:
                    first_error.append(f"{type(error).__name__}: {error}"[:300])
                time.sleep(0.01)
                continue
            mine.append((began, time.perf_counter()))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    window[0] = time.perf_counter()
    window[1] = window[0] + seconds
    start_gate.wait()
    for t in threads:
        t.join()
    flat = [span for per in spans for span in per]
    return Load([e - b for b, e in flat], sum(errors), seconds, window_work(flat, window[0], window[1]),
                (first_error or [""])[0])


# --------------------------------------------------------------------------------------------
# Processes the benchmark starts: the peer Triton, and its own stack for the identity model.
# --------------------------------------------------------------------------------------------


def free_port_block(count: int) -> list[int]:
    """`count` consecutive free ports."""
    start = 30000 + (os.getpid() * 7919) % 20000
    for low in range(start, 60000 - count, count + 1):
        ok = True
        for port in range(low, low + count):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(low, low + count))
    raise RuntimeError("no free ports")


def wait_http(host: str, port: int, path: str, timeout_s: float, proc: subprocess.Popen) -> float:
    """Seconds until GET path answers 200; raises when the process exits or time runs out."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the process exited with {proc.returncode} before {path} answered 200")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return time.monotonic() - began
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{path} on port {port} did not answer 200 within {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM to the process group we started (Triton cleans its shared memory then)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Peer:
    """A second Triton with its SageMaker front end, serving one model."""

    proc: subprocess.Popen
    sagemaker_port: int
    grpc_port: int


def start_peer(model: str, repositories: Sequence[Path], extra_models: Sequence[str], runtime: Path,
               log_path: Path) -> Peer:
    from app.serve.tritonserver import find_triton, triton_command

    install = find_triton()
    http_port, grpc_port, metrics_port, sagemaker_port = free_port_block(4)
    extra = [f"--model-repository={r}" for r in repositories[1:]]
    extra += ["--allow-sagemaker=true", f"--sagemaker-port={sagemaker_port}",
              "--model-control-mode=explicit", f"--load-model={model}"]
    extra += [f"--load-model={m}" for m in extra_models]
    argv = triton_command(install, repositories[0], (http_port, grpc_port, metrics_port),
                          backend_dir=install.prepare(runtime), extra_args=extra)
    env = {**os.environ, **install.env, "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": model}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    peer = Peer(proc, sagemaker_port, grpc_port)
    try:
        for name in (model, *extra_models):
            wait_http("127.0.0.1", http_port, f"/v2/models/{name}/ready", START_TIMEOUT_S, proc)
        wait_http("127.0.0.1", sagemaker_port, "/ping", 30, proc)
    except Exception:
        stop_process(proc)
        raise
    return peer


@dataclass
class OwnStack:
    proc: subprocess.Popen
    port: int
    grpc_port: int
    start_to_ping_s: float


def start_own_stack(repository: Path, log_path: Path) -> OwnStack:
    port, http_port, grpc_port, metrics_port = free_port_block(4)
    env = {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port),
           "SAGEMAKER_SAFE_PORT_RANGE": f"{http_port}-{metrics_port}", "MODEL_REPOSITORY": str(repository),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("TRITON_GRPC_URL", None)
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "serve")], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        took = wait_http("127.0.0.1", port, "/ping", START_TIMEOUT_S, proc)
    except Exception:
        stop_process(proc)
        raise
    return OwnStack(proc, port, grpc_port, took)


def router_workers(serve_pid: int) -> list[int]:
    """The gunicorn workers under a serve we started: the gunicorn children of a gunicorn process."""
    from scripts.devtools import children_of, cmdline, descendants

    gunicorns = [pid for pid in descendants(serve_pid) if "gunicorn" in cmdline(pid)]
    return [kid for pid in gunicorns for kid in children_of(pid) if "gunicorn" in cmdline(kid)]


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------------------------
# The benchmark's own repository: the identity model, resnet without dynamic batching.
# --------------------------------------------------------------------------------------------

IDENTITY_LENGTH = 16
IDENTITY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "."]

IDENTITY_TOML = f"""# The benchmark's trivial model: echoes its token ids as the one candidate of every position.
# It rides the fill_mask family, so the router serves it with no code of its own: the router's
# own cost (tokenise a short text, one gRPC call on [1, {IDENTITY_LENGTH}] tensors, build the answer).
family = "fill_mask"
description = "identity: token ids in, the same ids out (benchmark only)"
max_batch_size = 8

[[inputs]]
name = "input_ids"
dtype = "INT64"
dims = [{IDENTITY_LENGTH}]

[[inputs]]
name = "attention_mask"
dtype = "INT64"
dims = [{IDENTITY_LENGTH}]

[[outputs]]
name = "scores"
dtype = "FP32"
dims = [{IDENTITY_LENGTH}, 1]

[[outputs]]
name = "token_ids"
dtype = "INT64"
dims = [{IDENTITY_LENGTH}, 1]

[preprocess]
sequence_length = {IDENTITY_LENGTH}
vocab = "vocab.txt"
lowercase = true

[postprocess]
topk = 1
max_topk = 1
"""

IDENTITY_CONFIG = f"""name: "{IDENTITY}"
backend: "python"
max_batch_size: 8
input {{ name: "input_ids" data_type: TYPE_INT64 dims: [{IDENTITY_LENGTH}] }}
input {{ name: "attention_mask" data_type: TYPE_INT64 dims: [{IDENTITY_LENGTH}] }}
output {{ name: "scores" data_type: TYPE_FP32 dims: [{IDENTITY_LENGTH}, 1] }}
output {{ name: "token_ids" data_type: TYPE_INT64 dims: [{IDENTITY_LENGTH}, 1] }}
instance_group {{ count: 1 kind: KIND_CPU }}
"""

IDENTITY_MODEL = '''"""The benchmark's identity model: token_ids = input_ids, scores = 1."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()[..., None]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("scores", np.ones(ids.shape, np.float32)),
                pb_utils.Tensor("token_ids", ids.astype(np.int64)),
            ]))
        return responses
'''


def write_bench_repositories(out: Path, repository: Path, models: Sequence[str]) -> tuple[Path, Path]:
    """``out/stack-repository``: the identity model and links to the served models (the
    benchmark's own stack); ``out/nobatch-repository``: resnet without dynamic batching."""
    stack_repo = out / "stack-repository"
    if stack_repo.exists():
        shutil.rmtree(stack_repo)
    identity = stack_repo / IDENTITY
    (identity / "1").mkdir(parents=True)
    (identity / "model.toml").write_text(IDENTITY_TOML)
    (identity / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (identity / "vocab.txt").write_text("\n".join(IDENTITY_VOCAB) + "\n")
    (identity / "1" / "model.py").write_text(IDENTITY_MODEL)
    for model in models:
        (stack_repo / model).symlink_to((repository / model).resolve(), target_is_directory=True)

    nobatch_repo = out / "nobatch-repository"
    if nobatch_repo.exists():
        shutil.rmtree(nobatch_repo)
    if "resnet" in models:
        name = f"resnet{NOBATCH_SUFFIX}"
        folder = nobatch_repo / name
        folder.mkdir(parents=True)
        config = (repository / "resnet" / "config.pbtxt").read_text()
        folder.joinpath("config.pbtxt").write_text(_without_dynamic_batching(config, name))
        (folder / "1").symlink_to((repository / "resnet" / "1").resolve(), target_is_directory=True)
    return stack_repo, nobatch_repo


def _without_dynamic_batching(config: str, name: str) -> str:
    """A config.pbtxt (text format) renamed and with its dynamic_batching block removed."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(config, model_config_pb2.ModelConfig())
    parsed.name = name
    parsed.ClearField("dynamic_batching")
    return text_format.MessageToString(parsed)


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


def plot(results: Mapping, out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install -r requirements-dev.txt)", flush=True)
        return []
    written = []
    models = list(results)
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for side, by_c in results[model].items():
            cs = sorted(int(c) for c in by_c)
            ax.plot(cs, [by_c[str(c)]["throughput"] for c in cs], marker="o", label=side)
        ax.set_title(model)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("requests/s")
        ax.set_xticks(sorted({int(c) for by_c in results[model].values() for c in by_c}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    for model in models:
        sides = list(results[model])
        cs = sorted({int(c) for by_c in results[model].values() for c in by_c})
        fig, axes = plt.subplots(1, len(cs), figsize=(4 * len(cs), 4), squeeze=False)
        for ax, c in zip(axes[0], cs):
            width = 0.8 / 3
            for k, (q, key) in enumerate((("p50", "p50_ms"), ("p95", "p95_ms"), ("p99", "p99_ms"))):
                values = [results[model][s].get(str(c), {}).get(key, math.nan) for s in sides]
                ax.bar([i + (k - 1) * width for i in range(len(sides))], values, width, label=q)
            ax.set_xticks(range(len(sides)))
            ax.set_xticklabels(sides, rotation=30, fontsize=8)
            ax.set_title(f"{model}, c={c}")
            ax.set_ylabel("latency ms")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"latency-{model}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------
# perf_analyzer: the ceiling measured by Triton's own tool, to check B's client against it.
# --------------------------------------------------------------------------------------------


def perf_analyzer_env(out: Path) -> tuple[str, dict[str, str]] | None:
    """The binary of the tritonclient wheel and an environment where it finds libb64 and
    libcudart (both in nvidia_pytriton.libs under hashed names: a directory of links)."""
    binary = shutil.which("perf_analyzer", path=str(Path(sys.executable).parent))
    if binary is None:
        return None
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "nvidia_pytriton.libs"
    links = out / "perf_analyzer-libs"
    links.mkdir(parents=True, exist_ok=True)
    for prefix, name in (("libb64-", "libb64.so.0d"), ("libcudart-", "libcudart.so.12")):
        found = sorted(libs.glob(f"{prefix}*"))
        if not found:
            return None
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(found[0])
    lib_path = os.pathsep.join(filter(None, [str(links), os.environ.get("LD_LIBRARY_PATH")]))
    env = {**os.environ, "LD_LIBRARY_PATH": lib_path}
    return binary, env


def run_perf_analyzer(binary: str, env: Mapping[str, str], url: str, model: str, concurrency: int,
                      requests_per_window: int, out: Path) -> dict[str, float] | str:
    """perf_analyzer's throughput and p50 at one concurrency (zero-filled inputs), or why not.
    Windows are counted in requests: a window in milliseconds can hold no request at all when
    one takes seconds on a busy machine."""
    csv = out / f"perf_analyzer-{model}-c{concurrency}.csv"
    argv = [binary, "-m", model, "-u", url, "-i", "grpc", "--concurrency-range", str(concurrency),
            "--measurement-mode", "count_windows", "--measurement-request-count", str(requests_per_window),
            # Three windows within 2x of each other count as stable: the default (10 %) is never met on a
            # shared two-core machine, and perf_analyzer then reports nothing.
            "--input-data", "zero", "--max-trials", "5", "--stability-percentage", "100", "-f", str(csv)]
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0 or not csv.is_file():
        return (done.stderr or done.stdout).strip().splitlines()[-1][:300] if (done.stderr or done.stdout) else \
            f"exit {done.returncode}"
    header, row = csv.read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(",")))
    return {"throughput": float(values["Inferences/Second"]), "p50_ms": float(values["p50 latency"]) / 1000.0}


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


PERF_CONCURRENCY = 8


def perf_analyzer_check(model: str, b_call: Callable[[], None], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """perf_analyzer on the ceiling, with B's own client run just before and just after it (the
    machine drifts: the mean of the two brackets perf_analyzer's figure in time)."""
    found = perf_analyzer_env(out)
    if found is None:
        return {"perf_analyzer": "perf_analyzer not found (tritonclient==2.51.0 carries it)"}
    print(f"perf_analyzer on {model}, c={PERF_CONCURRENCY}, between two runs of B's own client ...", flush=True)
    seconds = max(2.0, 2 * args.step_seconds)
    before = run_load(b_call, PERF_CONCURRENCY, seconds)
    pa = run_perf_analyzer(*found, args.triton_grpc, model, PERF_CONCURRENCY, 16 if args.quick else 48, out)
    after = run_load(b_call, PERF_CONCURRENCY, seconds)
    own = Cell()
    for load in (before, after):
        own.add(load.latencies_s, load.errors, load.window_s, load.work, load.first_error)
    summary = own.summary()
    check: dict[str, Any] = {"perf_analyzer": pa, "own_client": {k: summary[k] for k in ("throughput", "p50_ms")},
                             "own_client_runs": [before.work / before.window_s, after.work / after.window_s]}
    if isinstance(pa, dict):
        check["throughput_ratio"] = summary["throughput"] / pa["throughput"]
        print(f"  perf_analyzer {pa['throughput']:.1f} req/s, own client {summary['throughput']:.1f} req/s "
              f"({check['own_client_runs'][0]:.1f} before, {check['own_client_runs'][1]:.1f} after)", flush=True)
    else:
        print(f"  perf_analyzer gave no figure: {pa}", flush=True)
    return check


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default="127.0.0.1:8080", help="the product's public host:port (NGINX)")
    p.add_argument("--triton-grpc", default="127.0.0.1:8001", help="the stack's Triton gRPC host:port (side B)")
    p.add_argument("--repository", type=Path,
                   default=Path(os.environ.get("MODEL_REPOSITORY") or ROOT / "models"),
                   help="the model repository the stack serves (the peer Triton and the benchmark's own stack "
                        "load the same)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma-separated levels")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--step-seconds", type=float, default=2.0, help="seconds of load per side per round")
    p.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured load per side before a model")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one request may take")
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="the JPEG sent to the image models")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the text sent to the fill-mask model")
    p.add_argument("--no-peer", action="store_true", help="skip C (the peer Triton)")
    p.add_argument("--no-identity", action="store_true",
                   help="skip the benchmark's own stack (identity model, start time, worker memory)")
    p.add_argument("--rss-requests", type=int, default=1000,
                   help="mixed requests sent to the benchmark's own stack before reading a router worker's memory")
    p.add_argument("--no-perf-analyzer", action="store_true", help="skip the perf_analyzer cross-check of B")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results.json, plots and logs go here")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: concurrency 1 and 8, one round of 1 s steps, short warm-up")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.rounds, args.step_seconds, args.warmup_seconds = "1,8", 1, 1.0, 0.5
        args.rss_requests = min(args.rss_requests, 60)
    return args


def send_mixed(callers: Sequence[Callable[[], None]], total: int, concurrency: int) -> int:
    """``total`` requests taking the callers in turn, ``concurrency`` at a time; the errors."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> int:
        try:
            callers[i % len(callers)]()
            return 0
        except Exception:  # counted: the figure is memory, not correctness
            return 1

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, range(total)))


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.began = total, 0, time.monotonic()

    def step(self, label: str, summary: Mapping[str, Any]) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.began
        left = elapsed / self.done * (self.total - self.done)
        errors = f", {summary['errors']} errors" if summary["errors"] else ""
        print(f"[{self.done}/{self.total} {elapsed:4.0f}s, ~{left:3.0f}s left] {label}: "
              f"{summary['throughput']:.1f} req/s, p50 {summary['p50_ms']:.1f} ms{errors}", flush=True)


def bench_model(model: str, callers: Mapping[str, Callable[[], None]], concurrencies: Sequence[int], args,
                cells: dict, progress: Progress) -> None:
    """Warm every side, then the interleaved steps of this model."""
    for side, call in callers.items():
        if args.warmup_seconds > 0:
            run_load(call, max(concurrencies), args.warmup_seconds)
    for step in schedule([model], {model: list(callers)}, concurrencies, args.rounds):
        load = run_load(callers[step.side], step.concurrency, args.step_seconds)
        cell = cells.setdefault(model, {}).setdefault(step.side, {}).setdefault(str(step.concurrency), Cell())
        one = Cell()
        for target in (cell, one):
            target.add(load.latencies_s, load.errors, load.window_s, load.work, load.first_error)
        progress.step(f"{model} {step.side} c={step.concurrency} round {step.round + 1}", one.summary())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from app.core.spec import load_spec

    models = [m for m in args.models.split(",") if m]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    repository = args.repository.resolve()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    runtime = out / "runtime"
    runtime.mkdir(exist_ok=True)
    if not args.image.is_file():
        print(f"{args.image} not found: run `make samples`, or pass --image", file=sys.stderr)
        return 2
    image = args.image.read_bytes()
    a_host, a_port = _host_port(args.url)
    specs = {m: load_spec(repository / m) for m in models}

    # Is the stack up? A clear message beats a table of errors.
    try:
        conn = http.client.HTTPConnection(a_host, a_port, timeout=5)
        conn.request("GET", "/ping")
        status = conn.getresponse().status
    except OSError as error:
        print(f"no stack answers on {args.url} ({error}): start it with `make run`, or pass --url", file=sys.stderr)
        return 2
    if status != 200:
        print(f"{args.url}/ping answers {status}: the stack is not ready", file=sys.stderr)
        return 2

    sides_per_model = 2 + 1 + (0 if args.no_peer else 2)
    steps = len(models) * len(concurrencies) * args.rounds * sides_per_model
    steps += 0 if args.no_peer or "resnet" not in models else len(concurrencies) * args.rounds
    steps += 0 if args.no_identity else len(concurrencies) * args.rounds * 3
    progress = Progress(steps)
    print(f"benchmark: {', '.join(models)} at concurrency {concurrencies}, {args.rounds} rounds of "
          f"{args.step_seconds:g} s steps ({steps} steps); product at {args.url}, Triton gRPC at {args.triton_grpc}, "
          f"repository {repository}", flush=True)

    stack_repo, nobatch_repo = write_bench_repositories(out, repository, models)
    cells: dict[str, dict[str, dict[str, Cell]]] = {}
    notes: list[str] = []
    extras: dict[str, float | None] = {}
    perf: dict[str, Any] = {}
    log_path = out / "processes.log"
    log_path.write_bytes(b"")

    for model in models:
        spec = specs[model]
        outputs = [t.name for t in spec.outputs]
        tensors = preprocessed_tensors(spec, args.image, args.text)
        callers: dict[str, Callable[[], None]] = {
            side: HttpCaller(r, args.timeout)
            for side, r in product_requests(model, spec.family, a_host, a_port, image, args.text).items()
        }
        closers = [GrpcCaller(args.triton_grpc, grpc_request(model, tensors, outputs), args.timeout)]
        callers["B"] = closers[0]
        peer = None
        if not args.no_peer:
            extra_models = [f"resnet{NOBATCH_SUFFIX}"] if model == "resnet" else []
            print(f"starting the peer Triton (SageMaker front end) for {model} ...", flush=True)
            began = time.monotonic()
            peer = start_peer(model, [repository, nobatch_repo] if extra_models else [repository], extra_models,
                              runtime, log_path)
            print(f"  ready after {time.monotonic() - began:.1f} s, SageMaker port {peer.sagemaker_port}", flush=True)
            for side, r in peer_requests("127.0.0.1", peer.sagemaker_port, tensors, outputs).items():
                callers[side] = HttpCaller(r, args.timeout)
            if extra_models:
                nobatch = GrpcCaller(f"127.0.0.1:{peer.grpc_port}",
                                     grpc_request(extra_models[0], tensors, outputs), args.timeout)
                closers.append(nobatch)
                callers["B-nobatch"] = nobatch
        try:
            bench_model(model, callers, concurrencies, args, cells, progress)
            if not args.no_perf_analyzer:
                perf[model] = perf_analyzer_check(model, callers["B"], args, out)
        finally:
            for closer in closers:
                closer.close()
            if peer is not None:
                stop_process(peer.proc)

    if not args.no_identity:
        print("starting the benchmark's own stack (identity model + the served models) ...", flush=True)
        stack = start_own_stack(stack_repo, log_path)
        extras["start_to_ping_s"] = stack.start_to_ping_s
        print(f"  /ping 200 after {stack.start_to_ping_s:.1f} s on port {stack.port}", flush=True)
        try:
            spec = load_spec(stack_repo / IDENTITY)
            tensors = preprocessed_tensors(spec, args.image, IDENTITY_TEXT)
            callers = {side: HttpCaller(r, args.timeout) for side, r in
                       product_requests(IDENTITY, spec.family, "127.0.0.1", stack.port, b"", IDENTITY_TEXT).items()}
            b = GrpcCaller(f"127.0.0.1:{stack.grpc_port}",
                           grpc_request(IDENTITY, tensors, [t.name for t in spec.outputs]), args.timeout)
            callers["B"] = b
            try:
                bench_model(IDENTITY, callers, concurrencies, args, cells, progress)
            finally:
                b.close()
            if args.rss_requests > 0:
                mixed = [HttpCaller(r, args.timeout) for m in models for r in
                         product_requests(m, specs[m].family, "127.0.0.1", stack.port, image, args.text).values()]
                print(f"{args.rss_requests} mixed requests ({', '.join(models)}; JSON and raw body) for the "
                      f"router's memory ...", flush=True)
                errors = send_mixed(mixed, args.rss_requests, concurrency=4)
                if errors:
                    notes.append(f"{errors} of the {args.rss_requests} mixed requests failed")
            workers = router_workers(stack.proc.pid)
            sizes = [s for s in (rss_mb(pid) for pid in workers) if s is not None]
            extras["worker_rss_mb"] = max(sizes) if sizes else None
            notes.append(f"router worker RSS on the benchmark's own stack after the identity steps and "
                         f"{args.rss_requests} mixed requests: {', '.join(f'{s:.0f} MB' for s in sizes)} "
                         f"(workers {workers}); the largest is the figure")
        finally:
            stop_process(stack.proc)

    results = {model: {side: {c: cell.summary() for c, cell in by_c.items()} for side, by_c in sides.items()}
               for model, sides in cells.items()}
    figures = target_figures(results, extras)
    checks = perf
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "perf_analyzer_check": checks,
        "extras": extras,
        "figures": [{**asdict(f), "passed": f.passed, "mark": f.mark} for f in figures],
        "notes": notes,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    plots = plot(results, out)

    print("\n" + format_results(results))
    if checks:
        print(f"\nB's client against perf_analyzer, c={PERF_CONCURRENCY} (own client run just before and just after):")
        for model, check in checks.items():
            pa = check["perf_analyzer"]
            if isinstance(pa, dict):
                own = check["own_client"]
                print(f"  {model}: perf_analyzer {pa['throughput']:.1f} req/s p50 {pa['p50_ms']:.1f} ms; own client "
                      f"{own['throughput']:.1f} req/s p50 {own['p50_ms']:.1f} ms (own / perf_analyzer "
                      f"{check['throughput_ratio']:.2f})")
            else:
                print(f"  {model}: perf_analyzer gave no figure: {pa}")
    print("\n" + format_figures(figures))
    for note in notes:
        print(f"note: {note}")
    print(f"\nwrote {out / 'results.json'}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
