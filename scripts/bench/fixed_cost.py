"""The router's fixed cost: its CPU per request against a bare Flask app served the same way.

The floor is ``scripts.bench.floor`` (one JSON route) under the router's own gunicorn configuration
(``app/router/gunicorn_conf.py``: worker class, workers, threads, a unix socket) behind the router's
own NGINX configuration (``nginx.conf``, filled in as ``serve`` fills it). The router is the
benchmark's own stack. Rows, each run at one concurrency for a few seconds per round, the rounds
interleaved so that the machine's noise falls on every row alike:

- ``floor``: a small JSON body to the bare app;
- ``floor, 40 ms wait``: the same, answered 40 ms later: the floor of the row below;
- ``bert_base text``: a one-mask text in the JSON envelope;
- ``resnet JPEG`` and ``yolov5 JPEG``: a raw JPEG (the Triton pipeline: the router forwards the bytes);
- ``identity envelope`` and ``identity v2``: the benchmark's tiny model, whose Triton work is
  negligible, in the envelope and as a KServe v2 body passed through;
- ``identity, 40 ms in Triton``: the same envelope to a copy of it that answers 40 ms later (no CPU
  spent meanwhile): the same code in the router, with requests that wait as long as a real model's.
  Set beside ``identity envelope`` it shows what the waiting alone costs the router's processes on
  the machine at hand (on a virtual machine, a thread woken after a long sleep costs far more CPU
  than one woken after a short one); its ratio is taken against the floor that waits as long.

For every step the CPU seconds of the gunicorn workers and of NGINX's processes are read from their
CPU-time clocks (``scripts.bench.placement.cpu_seconds``) before and after and divided by the
requests answered. Beside the rows, the section sets the identity model's ``A-raw`` (through NGINX)
against ``B`` (the same inference straight to Triton's gRPC) at ``FIXED_COST_CONCURRENCIES``: the
latency the router adds at 1, the share of Triton's throughput it passes on at 8
(``scripts.bench.report.target_figures``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.settings import DEFAULT_MAX_BODY_BYTES, PROJECT_ROOT, ROUTER_BIND
from app.serve.nginx import find_nginx, nginx_command
from app.serve.supervisor import GUNICORN_CONF
from scripts.bench.constants import CUSTOM_ATTRIBUTES, IDENTITY, IDENTITY_TEXT, IDENTITY_WAIT, IDENTITY_WAIT_MS
from scripts.bench.load import HttpCaller, run_load
from scripts.bench.payloads import HttpRequest
from scripts.bench.placement import CpuMeter, cpu_seconds
from scripts.bench.report import Figure
from scripts.devtools import children_of, descendants, free_ports, percentile, stop_group
from scripts.terminal import text_table

FLOOR = "floor"
FLOOR_WAIT = f"floor, {IDENTITY_WAIT_MS} ms wait"
IDENTITY_WAIT_ROW = f"identity, {IDENTITY_WAIT_MS} ms in Triton"
FLOOR_APP = "scripts.bench.floor:app"
ROLES = ("router", "nginx")
FIXED_COST_CONCURRENCY = 8
# Where identity's A-raw is set against B: the added latency at 1, the throughput at 8.
FIXED_COST_CONCURRENCIES = (1, 8)
# Each row and the model it calls.
FIXED_COST_ROWS = {
    "bert_base text": "bert_base",
    "resnet JPEG": "resnet",
    "yolov5 JPEG": "yolov5",
    "identity envelope": IDENTITY,
    "identity v2": IDENTITY,
    IDENTITY_WAIT_ROW: IDENTITY_WAIT,
}
# The rows with a target: router CPU per request / the floor's (the gunicorn workers of each).
TARGETS = {"bert_base text": 2.0, "resnet JPEG": 2.0, "yolov5 JPEG": 2.5}
# The floor each row is set against: the one that waits as long, for the row that waits.
REFERENCE = {FLOOR_WAIT: FLOOR, IDENTITY_WAIT_ROW: FLOOR_WAIT}


@dataclass
class Floor:
    """The bare app under gunicorn (the router's configuration) behind NGINX (the router's)."""

    gunicorn: subprocess.Popen
    nginx: subprocess.Popen
    port: int

    def pids(self) -> dict[str, list[int]]:
        return {"router": children_of(self.gunicorn.pid), "nginx": [self.nginx.pid, *descendants(self.nginx.pid)]}

    def stop(self) -> None:
        for proc in (self.nginx, self.gunicorn):
            stop_group(proc, timeout_s=10)


def start_floor(runtime: Path, log_path: Path, env: Mapping[str, str]) -> Floor:
    """The floor on a free port; its files in ``runtime``, its output appended to ``log_path``."""
    runtime = runtime.resolve()  # NGINX reads its paths against its prefix: all of them absolute
    runtime.mkdir(parents=True, exist_ok=True)
    socket_path = runtime / "floor.sock"
    port = free_ports(1)[0]
    with log_path.open("ab") as log:
        gunicorn = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONF), FLOOR_APP],
            cwd=PROJECT_ROOT,
            env={**env, ROUTER_BIND: f"unix:{socket_path}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            if gunicorn.poll() is not None or time.monotonic() > deadline:
                stop_group(gunicorn)
                raise RuntimeError(f"the floor's gunicorn did not start: see {log_path}")
            time.sleep(0.1)
        argv = nginx_command(
            find_nginx(env),
            runtime,
            port=port,
            router_socket=socket_path,
            ping_socket=runtime / "ping.sock",
            proxy_timeout_s=65,
            drain_timeout_s=5,
            models=[],
            max_body_bytes=DEFAULT_MAX_BODY_BYTES,
        )
        nginx = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    floor = Floor(gunicorn, nginx, port)
    call, deadline = HttpCaller(floor_request(port), 5), time.monotonic() + 30
    while True:  # up when its one route answers through NGINX
        try:
            call()
            return floor
        except (OSError, RuntimeError):
            if nginx.poll() is not None or time.monotonic() > deadline:
                floor.stop()
                raise RuntimeError(f"the floor did not answer through NGINX: see {log_path}") from None
            time.sleep(0.2)


def floor_request(port: int, wait_ms: float = 0) -> HttpRequest:
    body = json.dumps({"modelname": FLOOR, "payload": {"text": IDENTITY_TEXT}, "wait_ms": wait_ms}).encode()
    return HttpRequest("127.0.0.1", port, "/invocations", body, {"Content-Type": "application/json"})


def router_requests(port: int, image: bytes, text: str, identity_tensors: Mapping[str, Any]) -> dict[str, HttpRequest]:
    """The router's rows: what each sends to the benchmark's own stack."""

    def envelope(model: str, payload: Mapping[str, Any]) -> HttpRequest:
        body = json.dumps({"modelname": model, "payload": payload}).encode()
        return HttpRequest("127.0.0.1", port, "/invocations", body, {"Content-Type": "application/json"})

    def jpeg(model: str) -> HttpRequest:
        headers = {"Content-Type": "image/jpeg", CUSTOM_ATTRIBUTES: f"modelname={model}"}
        return HttpRequest("127.0.0.1", port, "/invocations", image, headers)

    v2 = {
        "inputs": [
            {"name": name, "shape": list(array.shape), "datatype": "INT64", "data": array.ravel().tolist()}
            for name, array in identity_tensors.items()
        ]
    }
    return {
        "bert_base text": envelope("bert_base", {"text": text}),
        "resnet JPEG": jpeg("resnet"),
        "yolov5 JPEG": jpeg("yolov5"),
        "identity envelope": envelope(IDENTITY, {"text": IDENTITY_TEXT}),
        IDENTITY_WAIT_ROW: envelope(IDENTITY_WAIT, {"text": IDENTITY_TEXT}),
        "identity v2": HttpRequest(
            "127.0.0.1",
            port,
            "/invocations",
            json.dumps(v2).encode(),
            {"Content-Type": "application/json", CUSTOM_ATTRIBUTES: f"modelname={IDENTITY}"},
        ),
    }


@dataclass
class Row:
    """One row over all its rounds: requests, errors, latencies and CPU seconds by role."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    first_error: str = ""

    def summary(self) -> dict[str, Any]:
        done = self.requests or 1
        return {
            "requests": self.requests,
            "errors": self.errors,
            "throughput": self.requests / self.seconds if self.seconds else 0.0,
            "p50_ms": percentile([s * 1000 for s in self.latencies_s], 50),
            **{f"{role}_cpu_ms": 1000.0 * self.cpu_s.get(role, 0.0) / done for role in ROLES},
            "first_error": self.first_error,
        }


def measure_rows(
    rows: Mapping[str, tuple[Callable[[], None], Callable[[], Mapping[str, Sequence[int]]]]],
    concurrency: int,
    rounds: int,
    seconds: float,
    warmup_s: float,
    progress: Callable[[str, Mapping[str, Any]], None],
) -> dict[str, dict[str, Any]]:
    """Each row's CPU per request: ``rows[name] = (call, pids by role)``, interleaved round by round."""
    measured = {name: Row() for name in rows}
    for call, _ in rows.values():
        if warmup_s > 0:
            run_load(call, concurrency, warmup_s)
    for number in range(rounds):
        names = list(rows)
        names = names[number % len(names) :] + names[: number % len(names)]  # no row always first
        for name in names:
            call, pids = rows[name]
            roles = pids()
            before = {role: sum(cpu_seconds(p) for p in roles[role]) for role in ROLES}
            load = run_load(call, concurrency, seconds)
            after = {role: sum(cpu_seconds(p) for p in roles[role]) for role in ROLES}
            row = measured[name]
            row.requests += len(load.latencies_s)
            row.errors += load.errors
            row.seconds += load.window_s
            row.latencies_s.extend(load.latencies_s)
            row.first_error = row.first_error or load.first_error
            for role in ROLES:
                row.cpu_s[role] = row.cpu_s.get(role, 0.0) + after[role] - before[role]
            progress(
                f"fixed cost {name} c={concurrency} round {number + 1}",
                Row(len(load.latencies_s), load.errors, load.window_s, load.latencies_s).summary(),
            )
    return {name: row.summary() for name, row in measured.items()}


def run_fixed_cost(
    stack: Any,
    identity_tensors: Mapping[str, Any],
    image: bytes,
    text: str,
    out: Path,
    models: Sequence[str],
    args: Any,
    progress: Callable[[str, Mapping[str, Any]], None],
) -> dict[str, dict[str, Any]]:
    """The floor and the router's rows of ``models`` (and the identity model's) on ``stack``, the
    benchmark's own, measured side by side (``args``: rounds, step and warm-up seconds, timeout)."""
    floor = start_floor(out / "floor", out / "processes.log", os.environ)
    try:
        meter = CpuMeter(stack)
        rows: dict[str, tuple[Callable[[], None], Callable[[], Mapping[str, Sequence[int]]]]] = {
            FLOOR: (HttpCaller(floor_request(floor.port), args.timeout), floor.pids),
            FLOOR_WAIT: (HttpCaller(floor_request(floor.port, IDENTITY_WAIT_MS), args.timeout), floor.pids),
        }
        for name, request in router_requests(stack.port, image, text, identity_tensors).items():
            if FIXED_COST_ROWS[name] in (*models, IDENTITY, IDENTITY_WAIT):
                rows[name] = (HttpCaller(request, args.timeout), lambda: meter.pids)
        return measure_rows(rows, FIXED_COST_CONCURRENCY, args.rounds, args.step_seconds, args.warmup_seconds, progress)
    finally:
        floor.stop()


def floor_of(name: str) -> str:
    """The row ``name`` is set against (``REFERENCE``: the waiting floor for the row that waits)."""
    return REFERENCE.get(name, FLOOR)


def floor_ratio(rows: Mapping[str, Mapping[str, Any]], name: str) -> float | None:
    """A row's gunicorn CPU per request over its floor's; None for the floor itself or a row not measured."""
    if name == FLOOR:
        return None
    mine = rows.get(name, {}).get("router_cpu_ms")
    floor = rows.get(floor_of(name), {}).get("router_cpu_ms")
    return mine / floor if mine is not None and floor else None


def fixed_cost_figures(rows: Mapping[str, Mapping[str, Any]]) -> list[Figure]:
    """Router CPU per request / the floor's, for the rows with a target."""
    return [
        Figure(f"router CPU per request / floor's, {name}", floor_ratio(rows, name), f"<= {target}")
        for name, target in TARGETS.items()
    ]


def format_fixed_cost(rows: Mapping[str, Mapping[str, Any]], concurrency: int) -> str:
    """The fixed-cost table: CPU per request of gunicorn's workers and of NGINX, and the ratios."""
    header = ("row", "requests", "req/s", "p50 ms", "gunicorn ms", "NGINX ms", "both ms", "/ floor", "target")
    lines = [header]
    for name, row in rows.items():
        router, nginx = row["router_cpu_ms"], row["nginx_cpu_ms"]
        ratio = floor_ratio(rows, name)
        lines.append(
            (
                name,
                str(row["requests"]) + (f" ({row['errors']} errors)" if row["errors"] else ""),
                f"{row['throughput']:.0f}",
                f"{row['p50_ms']:.1f}",
                f"{router:.3f}",
                f"{nginx:.3f}",
                f"{router + nginx:.3f}",
                "-" if ratio is None else f"{ratio:.2f}" + ("" if floor_of(name) == FLOOR else " (waiting floor)"),
                f"<= {TARGETS[name]}" if name in TARGETS else "",
            )
        )
    return (
        f"CPU per request at c={concurrency} (from /proc; the floor: a bare Flask app, same gunicorn and NGINX)\n"
        + text_table(lines)
    )
