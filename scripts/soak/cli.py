"""Soak: start the stack, send the three models requests at a fixed concurrency for a while, and
check that it loses nothing and leaks nothing.

Passes when no request failed, no process was replaced, every process's private resident memory
(RSS less shared memory) at the end is less than --max-rss-growth (default 10 %) above its highest
level during the warm-up (when allocators and ONNX Runtime's arenas reach their working size) or
less than --min-rss-growth-mib (default 8 MiB: NGINX's 6 MiB body buffer comes and goes) above it,
and its open file descriptors did
not grow by more than --max-fd-growth (default 2). File descriptors are counted with the load
paused and nothing in flight (at the warm-up's end and at the end): a socket of a request in
flight is no leak. Prints these figures.

    python -m scripts.soak                       # 10 minutes at concurrency 8 (make soak)
    python -m scripts.soak --duration 30         # a quick try
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import os
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import PROJECT_ROOT, TEST_MODEL_REPOSITORY
from scripts.devtools import (
    DEFAULT_TEST_REPOSITORY,
    Stack,
    built_test_repository,
    cmdline,
    percentile,
    proc_status,
    status_kib,
)

SAMPLE_EVERY_S = 5.0
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class Sample:
    rss_kib: int
    fds: int
    shmem_kib: int = 0  # of rss_kib: shared memory (Triton's python backend exchanges tensors there)

    @property
    def private_kib(self) -> int:
        return self.rss_kib - self.shmem_kib


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load after the warm-up (600)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=120.0,
        help="seconds of load before the measured part, after one request of the largest batch per model (120)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="clients sending at once (8)")
    parser.add_argument(
        "--repository",
        type=Path,
        default=Path(os.environ.get(TEST_MODEL_REPOSITORY, DEFAULT_TEST_REPOSITORY)),
        help="the Triton model repository to serve (default: build/test-models)",
    )
    parser.add_argument("--max-rss-growth", type=float, default=10.0, help="percent, per process (10)")
    parser.add_argument(
        "--min-rss-growth-mib",
        type=float,
        default=8.0,
        help="growth below this many MiB passes whatever its percentage (8)",
    )
    parser.add_argument("--max-fd-growth", type=int, default=2, help="open file descriptors, per process (2)")
    parser.add_argument(
        "--log-dir", type=Path, default=PROJECT_ROOT / "build" / "soak", help="where serve's log goes (build/soak)"
    )
    return parser.parse_args(argv)


def jpeg(width: int, height: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def requests_to_send() -> list[tuple[str, dict]]:
    """One request per model and way in: the JSON envelope and raw bodies, single items and lists."""
    image = jpeg(480, 360, 1)
    encoded = base64.b64encode(image).decode()
    raw = {"Content-Type": "image/jpeg"}
    return [
        ("resnet", {"json": {"modelname": "resnet", "payload": {"img": encoded}}}),
        ("yolov5", {"data": image, "headers": {**raw, "X-Amzn-SageMaker-Custom-Attributes": "modelname=yolov5"}}),
        ("bert_base", {"json": {"modelname": "bert_base", "payload": {"text": ["The [MASK] is blue.", "A [MASK]."]}}}),
        (
            "resnet",
            {"data": image, "headers": {**raw, "X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet,topk=5"}},
        ),
        ("yolov5", {"json": {"modelname": "yolov5", "payload": {"img": [encoded, encoded]}}}),
        (
            "bert_base",
            {
                "data": b"Paris is the [MASK] of France.",
                "headers": {
                    "Content-Type": "text/plain; charset=utf-8",
                    "X-Amzn-SageMaker-Custom-Attributes": "modelname=bert_base",
                },
            },
        ),
    ]


def send_largest_batches(url: str, repository: Path) -> None:
    """One list of max_batch_size items per model: Triton and ONNX Runtime reach their largest
    buffers now, not during the measured part."""
    import requests

    from clients.families import find_specs

    image = base64.b64encode(jpeg(480, 360, 2)).decode()
    inputs = {"resnet": ("img", image), "yolov5": ("img", image), "bert_base": ("text", "A [MASK] of words.")}
    for name, spec in sorted(find_specs(repository).items()):
        if name in inputs:
            field, item = inputs[name]
            batch = max(1, spec.max_batch_size)
            r = requests.post(
                f"{url}/invocations", timeout=300, json={"modelname": name, "payload": {field: [item] * batch}}
            )
            print(f"  {name}: a batch of {batch} answered {r.status_code}", flush=True)


def sample(pid: int) -> Sample | None:
    fields = proc_status(pid)
    if fields is None:
        return None
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return Sample(status_kib(fields, "VmRSS"), fds, status_kib(fields, "RssShmem"))


class Load:
    """``concurrency`` threads sending requests round the table until stopped; results by model."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.statuses: Counter = Counter()
        self.errors: list[str] = []
        self.table = requests_to_send()
        self.go = threading.Event()
        self.go.set()
        self.busy = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(concurrency)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def pause(self, timeout: float = 120.0) -> None:
        """Stops sending and waits until no request is in flight (and NGINX has closed its side)."""
        self.go.clear()
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)

    def resume(self) -> None:
        self.go.set()

    def finish(self) -> None:
        self.stop.set()
        self.go.set()
        for t in self.threads:
            t.join(timeout=120)

    def _run(self, index: int) -> None:
        import requests

        with requests.Session() as session:
            for model, kwargs in itertools.islice(itertools.cycle(self.table), index, None):
                self.go.wait()
                if self.stop.is_set():
                    return
                with self.lock:
                    if not self.go.is_set():  # paused between the wait and here: not started
                        continue
                    self.busy += 1
                began = time.perf_counter()
                try:
                    r = session.post(f"{self.url}/invocations", timeout=120, **kwargs)
                    status, detail = r.status_code, r.text[:200]
                except requests.RequestException as error:
                    status, detail = 0, repr(error)
                took = time.perf_counter() - began
                with self.lock:
                    self.busy -= 1
                    self.statuses[(model, status)] += 1
                    if status == 200:
                        self.latencies[model].append(took)
                    elif len(self.errors) < 20:
                        self.errors.append(f"{model}: {status} {detail}")


def processes(stack) -> dict[int, str]:
    """Every process of the stack with its role: serve, triton (and its python stubs), router, nginx.

    NGINX's cache loader is left out: it exits by design a minute after the start."""
    roles = {stack.proc.pid: "serve"}
    for role, pids in stack.pids().items():
        for i, pid in enumerate(pids):
            line = cmdline(pid)
            if "cache loader" in line:
                continue
            stub = re.search(r"/([^/ ]+)/[0-9]+/model\.py", line)  # a python backend stub: its model
            roles[pid] = role if i == 0 else f"stub {stub.group(1)}" if stub else f"{role} child"
    return roles


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repository = args.repository if (args.repository / "resnet" / "config.pbtxt").is_file() else built_test_repository()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(repository).start(args.log_dir)
    try:
        print(f"starting the stack on {repository} ...", flush=True)
        print(f"healthy after {stack.wait_healthy():.1f} s; serve's log: {stack.log_path}", flush=True)
        send_largest_batches(stack.url, repository)
        load = Load(stack.url, args.concurrency)
        load.start()
        print(f"warm-up: {args.warmup:.0f} s at concurrency {args.concurrency}", flush=True)
        roles = processes(stack)
        warm: dict[int, Sample] = {}  # each process's sample of highest private memory in the warm-up
        warmup_ends = time.monotonic() + args.warmup
        while (left := warmup_ends - time.monotonic()) > 0:
            time.sleep(min(SAMPLE_EVERY_S, left))
            for pid in roles:
                if (s := sample(pid)) is not None and (pid not in warm or s.private_kib > warm[pid].private_kib):
                    warm[pid] = s
        load.pause()
        baseline = {
            pid: Sample(warm[pid].rss_kib, s.fds, warm[pid].shmem_kib) for pid in warm if (s := sample(pid)) is not None
        }
        trace: dict[int, list[int]] = defaultdict(list)  # RSS every SAMPLE_EVERY_S, for the trend
        load.resume()
        print(f"measuring: {args.duration:.0f} s", flush=True)
        began = time.monotonic()
        while (left := args.duration - (time.monotonic() - began)) > 0:
            time.sleep(min(SAMPLE_EVERY_S, left))
            for pid in roles:
                s = sample(pid)
                if s is not None and pid in baseline:
                    trace[pid].append(s.private_kib)
            done = sum(load.statuses.values())
            print(f"  {time.monotonic() - began:5.0f} s  {done} requests  {len(load.errors)} errors", flush=True)
        load.pause()
        final = {pid: sample(pid) for pid in roles}
        replaced = sorted(set(processes(stack)) ^ set(roles))
        load.finish()
        return report(args, load, roles, baseline, final, trace, replaced, time.monotonic() - began + args.warmup)
    finally:
        stack.stop()


def report(args, load: Load, roles, baseline, final, trace, replaced, seconds: float) -> int:
    failures: list[str] = []
    total = sum(load.statuses.values())
    bad = sum(n for (_, status), n in load.statuses.items() if status != 200)
    print(
        f"\n{total} requests in {seconds:.0f} s ({total / seconds:.1f}/s) at concurrency {args.concurrency}, "
        f"{bad} errors"
    )
    for model in sorted(load.latencies):
        values = load.latencies[model]
        print(
            f"  {model:10} {len(values):6} ok  p50 {percentile(values, 50) * 1000:7.1f} ms  "
            f"p99 {percentile(values, 99) * 1000:7.1f} ms  mean {statistics.fmean(values) * 1000:7.1f} ms"
        )
    if bad:
        failures.append(f"{bad} requests failed: " + "; ".join(load.errors[:5]))
    print(
        "\nprivate = RSS less shared memory; warm: the warm-up's highest; growth: of private memory, from warm "
        "to the end;\nfds: counted with nothing in flight; the last column: private MiB at each quarter"
    )
    print(
        f"{'process':16} {'pid':>8} {'RSS warm':>9} {'RSS end':>8} {'private warm':>13} {'private end':>12} "
        f"{'growth':>8} {'fds warm':>9} {'fds end':>8}  trend"
    )
    for pid, role in sorted(roles.items(), key=lambda item: (item[1], item[0])):
        start, end = baseline.get(pid), final.get(pid)
        if start is None or end is None:
            failures.append(f"{role} {pid} is gone")
            print(f"{role:16} {pid:>8}   gone")
            continue
        grown_kib = end.private_kib - start.private_kib
        growth = 100.0 * grown_kib / start.private_kib
        points = trace.get(pid) or [end.private_kib]
        quarters = "/".join(f"{points[min(len(points) - 1, q * len(points) // 4)] / 1024:.0f}" for q in (1, 2, 3, 4))
        print(
            f"{role:16} {pid:>8} {start.rss_kib / 1024:9.1f} {end.rss_kib / 1024:8.1f} "
            f"{start.private_kib / 1024:13.1f} {end.private_kib / 1024:12.1f} {growth:7.1f}% "
            f"{start.fds:9} {end.fds:8}  {quarters}"
        )
        if growth >= args.max_rss_growth and grown_kib >= args.min_rss_growth_mib * 1024:
            failures.append(f"{role} {pid}: private resident memory grew {growth:.1f} % ({grown_kib / 1024:.1f} MiB)")
        if end.fds - start.fds > args.max_fd_growth:
            failures.append(f"{role} {pid}: open file descriptors {start.fds} -> {end.fds}")
    if replaced:
        failures.append(f"processes came or went during the soak: {replaced}")
    print()
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS: no errors, memory and file descriptors flat" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0
