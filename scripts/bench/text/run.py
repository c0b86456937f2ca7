"""``python -m scripts.bench.text``: prepare the repository, start one stack on it, measure every row
interleaved round by round, then report (``scripts.bench.text.report``)."""

from __future__ import annotations

import http.client
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.bench.constants import START_TIMEOUT_S
from scripts.bench.load import HttpCaller, run_load
from scripts.bench.payloads import HttpRequest
from scripts.bench.placement import CpuMeter
from scripts.bench.report import Cell, write_results
from scripts.bench.text import plan, prepare, report
from scripts.devtools import Stack

SEED_OF_LENGTH = {plan.SHORT: 1, plan.LONG: 2}
JSON_HEADERS = {"Content-Type": "application/json"}
_TICKS = os.sysconf("SC_CLK_TCK")


def text_caller(port: int, model: str, texts: Sequence[str], per_request: int, timeout_s: float) -> HttpCaller:
    """Requests of a row's texts through the public port: each call sends the next text (or the next
    ``per_request`` of them)."""
    return HttpCaller(
        [
            HttpRequest("127.0.0.1", port, "/invocations", body(model, texts, i, per_request), JSON_HEADERS)
            for i in range(len(texts))
        ],
        timeout_s,
    )


def body(model: str, texts: Sequence[str], start: int, per_request: int) -> bytes:
    """The JSON envelope of one request: one text (a string), or ``per_request`` of them (a list)."""
    chosen = [texts[(start + i) % len(texts)] for i in range(per_request)]
    return json.dumps({"modelname": model, "payload": {"text": chosen if per_request > 1 else chosen[0]}}).encode()


def check_row(caller: HttpCaller, row: plan.Row) -> None:
    """One request of the row, its answer read: every text answered, or a stop naming the row."""
    try:
        answer = caller.send(caller.requests[0])
    except (OSError, http.client.HTTPException, RuntimeError) as error:
        raise SystemExit(f"{row.key}: {error}") from None
    result = json.loads(answer)["result"]
    if row.texts > 1 and len(result) != row.texts:
        raise SystemExit(f"{row.key}: {len(result)} answers to {row.texts} texts")


class Encoder:
    """``SentenceTransformer(folder).encode(texts, batch_size=32)`` in this process: one call is one row's texts."""

    def __init__(self, folder: Path) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(folder), device="cpu")
        self.texts: Sequence[str] = ()

    def __call__(self) -> None:
        self.model.encode(list(self.texts), batch_size=plan.BATCH_TEXTS)


def own_cpu_s() -> float:
    """This process's CPU seconds (user + system, every thread): the clients' work, or encode()'s."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def row_texts(
    specs: Mapping[str, Any], lengths: Sequence[str]
) -> tuple[dict[tuple[str, str], list[str]], dict[tuple[str, str], float]]:
    """(family, length) -> the row's texts, made to the token count with the model's tokenizer; and
    their mean token count."""
    texts, tokens = {}, {}
    for family, spec in specs.items():
        count, limit = prepare.token_counter(spec), prepare.sequence_limit(spec)
        for length in lengths:
            target = plan.SHORT_TOKENS if length == plan.SHORT else plan.long_target(limit)
            chosen = plan.make_texts(
                count, target, plan.BATCH_TEXTS, SEED_OF_LENGTH[length], mask=family == plan.FILL_MASK
            )
            texts[family, length] = chosen
            tokens[family, length] = sum(map(count, chosen)) / len(chosen)
    return texts, tokens


def callers_of(stack: Stack, rows, texts, encoder: Encoder, timeout_s: float) -> dict[str, Callable[[], None]]:
    callers: dict[str, Callable[[], None]] = {}
    for row in rows:
        if row.kind == plan.ENCODE:
            callers[row.key] = encoder
            continue
        caller = text_caller(stack.port, plan.MODELS[row.family], texts[row.family, row.length], row.texts, timeout_s)
        check_row(caller, row)
        callers[row.key] = caller
    return callers


def machine_cpu_s() -> dict[str, float]:
    """The machine's busy CPU seconds, all CPUs (user, nice, system, irq, softirq), and the seconds
    the hypervisor stole, from /proc/stat: what ran besides the stack and this process shows up."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return {"machine": (user + nice + system + irq + softirq) / _TICKS, "steal": steal / _TICKS}


def measure(stack: Stack, rows, texts, encoder: Encoder, args) -> dict[str, list[Cell]]:
    """Warm every row, then the interleaved rounds; per row a Cell a round, with CPU seconds by
    role: the stack's processes (``router``: the gunicorn workers, ``triton``, ``nginx``), this
    process (``own``: the clients, or encode()), and the machine's (``machine``, ``steal``).

    Throughput is the requests completed in a step over the step's wall time, the calls in flight at
    the deadline waited for and counted whole: the CPU is read over the same interval, and a long
    row's requests take seconds, queued behind each other from the step's start, which the time
    share of ``scripts.bench.load.window_work`` would count as work done before it is."""
    callers = callers_of(stack, rows, texts, encoder, args.timeout)
    meter = CpuMeter(stack)

    def read() -> dict[str, float]:
        return {**meter(), "own": own_cpu_s(), **machine_cpu_s()}

    print(f"warming up {len(rows)} rows ({args.warmup_seconds:g} s each) ...", flush=True)
    for row in rows:
        encoder.texts = texts[row.family, row.length]
        if args.warmup_seconds > 0:
            run_load(callers[row.key], row.concurrency, args.warmup_seconds)
    cells: dict[str, list[Cell]] = {row.key: [] for row in rows}
    steps = plan.schedule(rows, args.rounds)
    began = time.monotonic()
    for done, (r, row) in enumerate(steps, 1):
        encoder.texts = texts[row.family, row.length]
        before, started = read(), time.perf_counter()
        load = run_load(callers[row.key], row.concurrency, args.seconds)
        wall, after = time.perf_counter() - started, read()
        cell = Cell()
        cpu = {role: after[role] - before[role] for role in after}
        cell.add(load.latencies_s, load.errors, wall, len(load.latencies_s), load.first_error, cpu)
        cells[row.key].append(cell)
        elapsed = time.monotonic() - began
        print(
            f"[{done}/{len(steps)} {elapsed:4.0f}s, ~{elapsed / done * (len(steps) - done):3.0f}s left] "
            f"round {r + 1}/{args.rounds} {report.progress_line(row, cell)}",
            flush=True,
        )
    return cells


def run_stack(repository: Path, out: Path, rows, texts, encoder: Encoder, args) -> tuple[dict[str, list[Cell]], float]:
    """The stack on free ports (``serve``, as ``scripts.bench.peers.start_own_stack`` starts it, with
    ``--env``'s variables) for the rounds, stopped whatever happens; the cells and its start time."""
    shown = "".join(f" {name}={value}" for name, value in args.env)
    print(f"starting the stack on {repository}{' with' + shown if shown else ''} ...", flush=True)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stack = Stack(repository, env_extra=dict(args.env)).start(logs)
    try:
        stack.start_to_ping_s = stack.wait_healthy(START_TIMEOUT_S)
    except Exception:
        stack.stop()
        raise
    print(f"  /ping 200 after {stack.start_to_ping_s:.1f} s on port {stack.port}", flush=True)
    try:
        return measure(stack, rows, texts, encoder, args), stack.start_to_ping_s
    finally:
        print("stopping the stack ...", flush=True)
        stack.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = plan.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_prepare:
        print(f"preparing {args.repository} ({'small' if args.small else 'realistic'} models) ...", flush=True)
        prepare.prepare_repository(args.out.resolve(), args.repository, args.small)
    specs = prepare.load_specs(args.repository)
    rows = plan.plan_rows(args.lengths, args.concurrency, args.single_concurrency)
    texts, tokens = row_texts(specs, args.lengths)
    folder = prepare.embedding_folder(args.out.resolve(), args.small)
    print(f"loading SentenceTransformer({folder}) for the in-process side ...", flush=True)
    encoder = Encoder(folder)
    cells, start_s = run_stack(args.repository, args.out, rows, texts, encoder, args)
    found = report.results(rows, cells, tokens, args, start_s)
    write_results(
        args.out / "results.json",
        found,
        report.format_table(found["rows"]),
        report.format_verdicts(found["verdicts"]),
        report.noise_lines(found["rows"]),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
