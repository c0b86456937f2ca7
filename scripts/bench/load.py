"""The callers (HTTP keep-alive, gRPC) and the load loop that measures them."""

from __future__ import annotations

import http.client
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from scripts.bench.payloads import HttpRequest
from scripts.bench.report import Cell, schedule


class HttpCaller:
    """One keep-alive connection per thread; each call sends the next of its requests (all to one host
    and port; one request: always that one). A non-2xx answer is an error."""

    def __init__(self, requests: HttpRequest | Sequence[HttpRequest], timeout_s: float) -> None:
        self.requests = [requests] if isinstance(requests, HttpRequest) else list(requests)
        self.timeout_s = timeout_s
        self.turn = itertools.count()  # next() of a count is atomic under the GIL
        self.local = threading.local()

    def __call__(self) -> None:
        self.send(self.requests[next(self.turn) % len(self.requests)])

    def send(self, r: HttpRequest) -> bytes:
        """One request on this thread's connection; the answer's body."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(r.host, r.port, timeout=self.timeout_s)
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
        return body


class GrpcCaller:
    """The ceiling's client: one channel, the prebuilt request, no per-call Python work."""

    def __init__(self, url: str, request: Any, timeout_s: float) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.channel = grpc.insecure_channel(
            url, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        )
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
            except Exception as error:  # noqa: BLE001 - counted and reported, the load goes on
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
    return Load(
        [e - b for b, e in flat],
        sum(errors),
        seconds,
        window_work(flat, window[0], window[1]),
        (first_error or [""])[0],
    )


def run_calls(calls: Sequence[Callable[[], None]], concurrency: int) -> Load:
    """Every call once, ``concurrency`` at a time (1: in this thread), each timed; the window is the
    wall time from the first start to the last end: for rows whose calls take seconds (a fixed count
    of images, not a fixed time)."""
    latencies, errors, first_error = [], [0], []

    def one(call: Callable[[], None]) -> None:
        began = time.perf_counter()
        try:
            call()
        except Exception as error:  # noqa: BLE001 - counted and reported, the row goes on
            errors[0] += 1
            first_error.append(f"{type(error).__name__}: {error}"[:300])
            return
        latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    if concurrency == 1:
        for call in calls:
            one(call)
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, calls))
    wall = time.perf_counter() - started
    return Load(latencies, errors[0], wall, float(len(latencies)), (first_error or [""])[0])


def send_mixed(callers: Sequence[Callable[[], None]], total: int, concurrency: int) -> int:
    """``total`` requests taking the callers in turn, ``concurrency`` at a time; the errors."""

    def one(i: int) -> int:
        try:
            callers[i % len(callers)]()
            return 0
        except Exception:  # noqa: BLE001 - counted: the figure is memory, not correctness
            return 1

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, range(total)))


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.began = total, 0, time.monotonic()

    def step(self, label: str, summary: Mapping[str, Any]) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.began
        left = elapsed / self.done * (self.total - self.done)
        errors = f", {summary['errors']} errors" if summary["errors"] else ""
        print(
            f"[{self.done}/{self.total} {elapsed:4.0f}s, ~{left:3.0f}s left] {label}: "
            f"{summary['throughput']:.1f} req/s, p50 {summary['p50_ms']:.1f} ms{errors}",
            flush=True,
        )


def bench_model(
    model: str,
    callers: Mapping[str, Callable[[], None]],
    concurrencies: Sequence[int],
    args,
    cells: dict,
    progress: Progress,
    meter: Callable[[], dict[str, float]] | None = None,
) -> None:
    """Warm every side, then the interleaved steps of this model; ``meter``, when given, reads the
    CPU seconds of the stack's processes by role before and after each step."""
    for call in callers.values():
        if args.warmup_seconds > 0:
            run_load(call, max(concurrencies), args.warmup_seconds)
    for step in schedule([model], {model: list(callers)}, concurrencies, args.rounds):
        before = meter() if meter else {}
        load = run_load(callers[step.side], step.concurrency, args.step_seconds)
        after = meter() if meter else {}
        cpu = {role: after[role] - before[role] for role in after}
        cell = cells.setdefault(model, {}).setdefault(step.side, {}).setdefault(str(step.concurrency), Cell())
        one = Cell()
        for target in (cell, one):
            target.add(load.latencies_s, load.errors, load.window_s, load.work, load.first_error, cpu)
        progress.step(f"{model} {step.side} c={step.concurrency} round {step.round + 1}", one.summary())
