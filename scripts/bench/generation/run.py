"""``python -m scripts.bench.generation``: prepare the repository, load ``generate``'s side, start one
stack, check every row once, measure them interleaved round by round, then report
(``scripts.bench.generation.report``)."""

from __future__ import annotations

import http.client
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from app.core.generation import end_ids
from app.triton.generation import trimmed
from scripts.bench.constants import START_TIMEOUT_S
from scripts.bench.generation import plan, prepare, report
from scripts.bench.load import HttpCaller, run_load
from scripts.bench.payloads import HttpRequest
from scripts.bench.placement import CpuMeter
from scripts.bench.report import Cell
from scripts.bench.text.plan import make_texts
from scripts.bench.text.run import JSON_HEADERS, machine_cpu_s, own_cpu_s
from scripts.devtools import Stack

TOKENS_METRIC = f'router_generated_tokens_total{{model="{plan.MODEL}"}}'


class Generate:
    """``model.generate`` in this process on the folder the endpoint serves (PyTorch, eager), as a user
    would call it: tokenize a batch (padded), generate, decode. Counts the tokens it generates."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.ends = end_ids(self.model.generation_config.to_dict(), self.model.config.to_dict())
        self.tokens = 0

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


def endpoint_caller(port: int, texts: Sequence[str], settings: Mapping[str, int], timeout_s: float) -> HttpCaller:
    """Single-text requests through the public port, each call the next text."""
    return HttpCaller(
        [
            HttpRequest(
                "127.0.0.1",
                port,
                "/invocations",
                json.dumps({"modelname": plan.MODEL, "payload": {"text": text, **settings}}).encode(),
                JSON_HEADERS,
            )
            for text in texts
        ],
        timeout_s,
    )


def generated_tokens(stack: Stack) -> float:
    """The router's count of the tokens it returned for the model (every worker's, from /metrics)."""
    for line in requests.get(f"{stack.url}/metrics", timeout=30).text.splitlines():
        if line.startswith(TOKENS_METRIC):
            return float(line.split()[-1])
    return 0.0


def callers_of(stack: Stack, rows, texts, generate: Generate, args) -> tuple[dict[str, Callable[[], None]], dict]:
    """Each row's caller, and whether the endpoint's answer to the first text is ``generate``'s
    (greedy and beam search; ONNX Runtime's float sums may tip a near tie: reported, not asserted)."""
    callers, same = {}, {}
    for row in rows:
        settings = plan.payload_settings(args.max_new_tokens, row.beams)
        if row.side == plan.GENERATE:
            callers[row.key] = generate.caller(texts, row.batch, settings)
            continue
        caller = callers[row.key] = endpoint_caller(stack.port, texts, settings, args.timeout)
        try:
            answer = json.loads(caller.send(caller.requests[0]))["result"]["generated_text"]
        except (OSError, http.client.HTTPException, RuntimeError, KeyError, TypeError) as error:
            raise SystemExit(f"{row.key}: {error}") from None
        same[row.key] = answer == generate.answers(texts[:1], settings)[0]
        print(f"  {row.key}: the answer to the first text is generate's: {same[row.key]}", flush=True)
    return callers, same


def measure(stack: Stack, rows, texts, generate: Generate, args) -> tuple[dict[str, list[Cell]], dict, dict]:
    """Warm every row, then the interleaved rounds. Per row a Cell a round (calls, latencies, CPU
    seconds by role: ``router``, ``triton``, ``nginx``, ``own`` (this process), ``machine``, ``steal``)
    and the tokens generated in the round (the router's counter, or generate's own count)."""
    from scripts.bench.text.plan import schedule

    callers, same = callers_of(stack, rows, texts, generate, args)
    meter = CpuMeter(stack)
    print(f"warming up {len(rows)} rows ({args.warmup_seconds:g} s each) ...", flush=True)
    for row in rows:
        if args.warmup_seconds > 0:
            run_load(callers[row.key], row.concurrency, args.warmup_seconds)
    cells: dict[str, list[Cell]] = {row.key: [] for row in rows}
    tokens: dict[str, list[float]] = {row.key: [] for row in rows}
    steps = schedule(rows, args.rounds)
    began = time.monotonic()
    for done, (r, row) in enumerate(steps, 1):
        counted = generated_tokens if row.side == plan.ENDPOINT else lambda _: generate.tokens
        first, cpu, started = counted(stack), {**meter(), "own": own_cpu_s(), **machine_cpu_s()}, time.perf_counter()
        load = run_load(callers[row.key], row.concurrency, args.seconds)
        wall = time.perf_counter() - started
        spent = {role: value - cpu[role] for role, value in {**meter(), "own": own_cpu_s(), **machine_cpu_s()}.items()}
        tokens[row.key].append(counted(stack) - first)
        cell = Cell()
        cell.add(load.latencies_s, load.errors, wall, len(load.latencies_s), load.first_error, spent)
        cells[row.key].append(cell)
        elapsed = time.monotonic() - began
        print(
            f"[{done}/{len(steps)} {elapsed:4.0f}s, ~{elapsed / done * (len(steps) - done):3.0f}s left] "
            f"round {r + 1}/{args.rounds} {report.progress(row, cell, tokens[row.key][-1])}",
            flush=True,
        )
    return cells, tokens, same


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


def main(argv: Sequence[str] | None = None) -> int:
    args = plan.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_prepare:
        print(f"preparing {args.repository} ({'small' if args.small else 'realistic'} model) ...", flush=True)
        prepare.prepare_repository(args.out.resolve(), args.repository, args.small)
    spec = prepare.load_model_spec(args.repository)
    folder = prepare.sources(args.out.resolve(), args.small) / plan.MODEL / "hf"
    print(f"loading AutoModelForSeq2SeqLM({folder}) for the in-process side ...", flush=True)
    generate = Generate(folder)
    texts = make_texts(generate.count, args.text_tokens, args.texts, seed=1)
    rows = plan.plan_rows(args.concurrency, args.batch, args.beams)
    with serving(args.repository, args.out, args.env) as stack:
        cells, tokens, same = measure(stack, rows, texts, generate, args)
        sizing = sizing_line(stack)
    found: dict[str, Any] = report.results(rows, cells, tokens, args, stack.start_to_ping_s or 0.0)
    found.update(
        sizing=sizing,
        model=str(spec.folder),
        tokens_per_text=sum(map(generate.count, texts)) / len(texts),
        same_as_generate=same,
    )
    write_results(args.out / "results.json", found)
    return 0


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    """results.json, then the table, the noise lines (if any) and the verdicts: the run's product."""
    from scripts.bench.text.report import noise_lines

    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path}\n\n{report.format_table(results['rows'])}\n", flush=True)
    if results["sizing"]:
        print(f"serve: {results['sizing']}\n", flush=True)
    noise = noise_lines(results["rows"])
    if noise:
        print(noise + "\n", flush=True)
    print(report.format_verdicts(results["verdicts"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
