"""The stack's side of the generation benchmark: ``serve`` on free ports, single-text requests
through its public port, and the counters read around each step: the router's generated tokens
(``router_generated_tokens``, every worker's) and Triton's texts and executions of the model (texts
over executions: the batch Triton's dynamic batcher formed from the callers' requests)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from scripts.bench.constants import START_TIMEOUT_S
from scripts.bench.generation.plan import MODEL
from scripts.bench.load import HttpCaller
from scripts.bench.payloads import HttpRequest
from scripts.bench.text.run import JSON_HEADERS
from scripts.devtools import Stack

LABEL = f'{{model="{MODEL}"'  # the model's label, first in the router's and Triton's counters
COUNTERS = {  # what counters() reads: (the metric, which port's /metrics)
    "tokens": ("router_generated_tokens_total", "router"),
    "texts": ("nv_inference_count", "triton"),
    "executions": ("nv_inference_exec_count", "triton"),
}


def endpoint_caller(port: int, texts: Sequence[str], settings: Mapping[str, int], timeout_s: float) -> HttpCaller:
    """Single-text requests through the public port, each call the next text."""
    bodies = [json.dumps({"modelname": MODEL, "payload": {"text": text, **settings}}).encode() for text in texts]
    return HttpCaller([HttpRequest("127.0.0.1", port, "/invocations", b, JSON_HEADERS) for b in bodies], timeout_s)


def read_counters(pages: Mapping[str, str]) -> dict[str, float]:
    """``COUNTERS``' values for the model from the Prometheus pages by port (0 where absent)."""
    found = dict.fromkeys(COUNTERS, 0.0)
    for name, (metric, port) in COUNTERS.items():
        for line in pages[port].splitlines():
            if line.startswith(metric + LABEL):
                found[name] += float(line.split()[-1])  # Triton: one line a version
    return found


def counters(stack: Stack) -> dict[str, float]:
    """The router's and Triton's counters of the model now (Triton's metrics port is its third)."""
    pages = {
        "router": requests.get(f"{stack.url}/metrics", timeout=30).text,
        "triton": requests.get(f"http://127.0.0.1:{stack.triton_ports[2]}/metrics", timeout=30).text,
    }
    return read_counters(pages)


@contextmanager
def serving(repository: Path, out: Path, env: Sequence[tuple[str, str]]) -> Iterator[Stack]:
    """The stack on free ports (``serve`` with ``--env``'s variables), stopped whatever happens."""
    shown = "".join(f" {name}={value}" for name, value in env)
    print(f"starting the stack on {repository}{' with' + shown if shown else ''} ...", flush=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    stack = Stack(repository, env_extra=dict(env)).start(out / "logs")
    try:
        stack.start_to_ping_s = stack.wait_healthy(START_TIMEOUT_S)
        print(f"  /ping 200 after {stack.start_to_ping_s:.1f} s on port {stack.port}", flush=True)
        yield stack
    finally:
        print("stopping the stack ...", flush=True)
        stack.stop()


def sizing_line(stack: Stack) -> str:
    """``serve``'s record of how it sized the stack (its workers, each model's instances and threads)."""
    found = [line for line in stack.log_tail(10_000).splitlines() if "sized for" in line]
    if not found:
        return ""
    try:
        return str(json.loads(found[-1]).get("message", found[-1]))
    except ValueError:
        return found[-1]
