"""``python -m scripts.bench.generation``: prepare the repository, load ``generate``'s side, start one
stack, check every row once, measure them interleaved round by round, then report
(``scripts.bench.generation.report``)."""

from __future__ import annotations

import http.client
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.core.generation_contract import end_ids
from app.triton.onnx_generate import trimmed
from scripts.bench import prepared
from scripts.bench.generation import plan, prepare, report, stack_side
from scripts.bench.load import Load, Progress, run_load
from scripts.bench.placement import CpuMeter
from scripts.bench.report import Cell, write_results
from scripts.bench.text.plan import make_texts, schedule
from scripts.bench.text.report import noise_lines
from scripts.bench.text.run import machine_cpu_s, own_cpu_s
from scripts.devtools import Stack


class Generate:
    """``model.generate`` in this process on the folder the endpoint serves (PyTorch, eager), as a user
    would call it: tokenize a batch (padded), generate, decode. Counts the tokens it generates."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.ends = end_ids(self.model.generation_config.to_dict(), self.model.config.to_dict())
        self.tokens = 0

    @property
    def threads(self) -> int:
        """PyTorch's intra-op threads in this process (all the CPUs it may use, unless told otherwise)."""
        import torch

        return torch.get_num_threads()

    def count(self, text: str) -> int:
        """A text's tokens, ``</s>`` included (as the router counts them)."""
        return len(self.tokenizer(text).input_ids)

    def answers(self, texts: Sequence[str], settings: Mapping[str, int]) -> list[str]:
        import torch

        with torch.inference_mode():
            found = self.model.generate(
                **self.tokenizer(list(texts), padding=True, return_tensors="pt"), do_sample=False, **settings
            )
        # as the endpoint counts them: up to the first </s> of each text, the decoder's start token left out
        self.tokens += sum(len(trimmed(row, self.ends)) - 1 for row in found.numpy())
        return self.tokenizer.batch_decode(found, skip_special_tokens=True)

    def caller(self, texts: Sequence[str], batch: int, settings: Mapping[str, int]) -> Callable[[], None]:
        """Each call generates the next ``batch`` texts, cycling through ``texts``."""
        turn = itertools.count()

        def call() -> None:
            start = next(turn) * batch
            self.answers([texts[(start + i) % len(texts)] for i in range(batch)], settings)

        return call


def callers_of(stack: Stack, rows, texts, generate: Generate, args) -> tuple[dict[str, Callable[[], None]], dict]:
    """Each row's caller, and whether the endpoint's answer to the first text is ``generate``'s
    (greedy and beam search; ONNX Runtime's float sums may tip a near tie: reported, not asserted)."""
    callers, same = {}, {}
    for row in rows:
        settings = plan.payload_settings(args.max_new_tokens, row.beams)
        if row.side == plan.GENERATE:
            callers[row.key] = generate.caller(texts, row.batch, settings)
            continue
        caller = callers[row.key] = stack_side.endpoint_caller(stack.port, texts, settings, args.timeout)
        try:
            answer = json.loads(caller.send(caller.requests[0]))["result"]["generated_text"]
        except (OSError, http.client.HTTPException, RuntimeError, KeyError, TypeError) as error:
            raise SystemExit(f"{row.key}: {error}") from None
        same[row.key] = answer == generate.answers(texts[:1], settings)[0]
        print(f"  {row.key}: the answer to the first text is generate's: {same[row.key]}", flush=True)
    return callers, same


def own_and_machine() -> dict[str, float]:
    return {"own": own_cpu_s(), **machine_cpu_s()}


def in_main_thread(call: Callable[[], None], seconds: float) -> Load:
    """``generate``'s closed loop, in this process's main thread, as a user calls it. From a worker
    thread of ``run_load`` it ran at 55 tokens/s on 1.2 of the 2 CPUs while the stack was up
    (idle), against 91 from the main thread and 90 from a worker thread with no stack: an artifact of
    the harness, not generate's speed."""
    latencies, deadline = [], time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        began = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - began)
    return Load(latencies, 0, seconds, float(len(latencies)))


def load_of(row: plan.Row, call: Callable[[], None], seconds: float) -> Load:
    """A row's closed loop for ``seconds``: client threads for the endpoint, the main thread for generate."""
    return run_load(call, row.concurrency, seconds) if row.side == plan.ENDPOINT else in_main_thread(call, seconds)


def step(row: plan.Row, call: Callable[[], None], seconds: float, cpu: Callable[[], dict[str, float]]) -> Cell:
    """One step of a row: its closed loop for ``seconds``, the calls in flight at the end waited for
    and counted whole (a call takes up to seconds: the CPU is read over the same interval)."""
    before, started = cpu(), time.perf_counter()
    load = load_of(row, call, seconds)
    wall, after = time.perf_counter() - started, cpu()
    found = Cell()
    found.add(load.latencies_s, load.errors, wall, len(load.latencies_s), load.first_error)
    found.cpu_s = {role: after[role] - before[role] for role in after}
    return found


def measure(stack: Stack, rows, texts, generate: Generate, args) -> tuple[dict[str, list[Cell]], dict, dict]:
    """Warm every row, then the interleaved rounds. Per row a Cell a round (calls, latencies, CPU
    seconds by role: ``router``, ``triton``, ``nginx``, ``own`` (this process), ``machine``, ``steal``)
    and the round's counts: the tokens generated (the router's counter, or generate's own count),
    Triton's texts and executions of the model."""
    callers, same = callers_of(stack, rows, texts, generate, args)
    meter = CpuMeter(stack)
    print(f"warming up {len(rows)} rows ({args.warmup_seconds:g} s each) ...", flush=True)
    for row in rows:
        if args.warmup_seconds > 0:
            load_of(row, callers[row.key], args.warmup_seconds)
    cells: dict[str, list[Cell]] = {row.key: [] for row in rows}
    counts: dict[str, list[dict[str, float]]] = {row.key: [] for row in rows}
    steps = schedule(rows, args.rounds)
    progress = Progress(len(steps))

    def counted(row: plan.Row) -> dict[str, float]:  # read outside the step's CPU interval
        return stack_side.counters(stack) if row.side == plan.ENDPOINT else {"tokens": generate.tokens}

    for r, row in steps:
        first = counted(row)
        cell = step(row, callers[row.key], args.seconds, lambda: {**meter(), **own_and_machine()})
        counts[row.key].append({name: value - first[name] for name, value in counted(row).items()})
        cells[row.key].append(cell)
        progress.step(report.progress_label(r, args.rounds, row, cell, counts[row.key][-1]["tokens"]), cell.summary())
    return cells, counts, same


def main(argv: Sequence[str] | None = None) -> int:
    args = plan.parse_args(argv)
    spec = prepare.ready(args.out.resolve(), args.repository, args.small, not args.no_prepare)
    folder = prepared.sources(args.out.resolve(), args.small) / plan.MODEL / "hf"
    print(f"loading AutoModelForSeq2SeqLM({folder}) for the in-process side ...", flush=True)
    generate = Generate(folder)
    texts = make_texts(generate.count, args.text_tokens, args.texts, seed=1)
    rows = plan.plan_rows(args.concurrency, args.batch, args.beams)
    with stack_side.serving(args.repository, args.out, args.env) as stack:
        cells, counts, same = measure(stack, rows, texts, generate, args)
        sizing = stack_side.sizing_line(stack)
    found: dict[str, Any] = report.results(rows, cells, counts, args, stack.start_to_ping_s or 0.0)
    found.update(
        sizing=sizing,
        served=str(spec.folder),
        generate_folder=str(folder),
        generate_threads=generate.threads,
        input_tokens_per_text=sum(map(generate.count, texts)) / len(texts),
        same_as_generate=same,
    )
    write_results(
        args.out / "results.json",
        found,
        report.format_table(found["rows"]),
        report.format_verdicts(found["verdicts"]),
        noise_lines(found["rows"]),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
