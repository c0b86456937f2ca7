"""``python -m scripts.bench.chat``: prepare the repository, load ``generate``'s side, start one stack,
check the answers once, measure every row interleaved round by round, then report
(``scripts.bench.chat.report``)."""

from __future__ import annotations

import http.client
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import requests

from app.core.causal_lm_contract import context_length
from app.core.generation_contract import end_ids
from scripts.bench import prepared
from scripts.bench.chat import endpoint, llama_cpp, plan, prepare, report
from scripts.bench.chat.endpoint import Caller, LongGenerations, ToolCaller
from scripts.bench.chat.llama_cpp import LlamaCaller, LlamaServer
from scripts.bench.generation.run import in_main_thread, own_and_machine
from scripts.bench.generation.stack_side import serving, sizing_line
from scripts.bench.load import Load, Progress, run_load
from scripts.bench.placement import CpuMeter
from scripts.bench.report import Cell, write_results
from scripts.bench.text.plan import make_texts, schedule
from scripts.bench.text.report import noise_lines
from scripts.devtools import Stack

CANCEL_WAIT_S = 5.0  # how long the cut long generations may take to be cancelled before the next step


class Generate:
    """``model.generate`` in this process on the folder the endpoint serves (PyTorch, eager), as a user
    would call it: tokenize one prompt, generate greedily, decode the new tokens. Counts them."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.ends = end_ids(self.model.generation_config.to_dict(), self.model.config.to_dict())
        self.positions = context_length(self.model.config.to_dict())
        self.tokens = 0
        self.last: list[int] = []  # the last answer's tokens

    @property
    def threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def count(self, text: str) -> int:
        """A prompt's tokens, ``<s>`` included (as the router encodes it)."""
        return len(self.tokenizer(text).input_ids)

    def answer(self, text: str, max_new_tokens: int) -> str:
        import torch

        given = self.tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            found = self.model.generate(**given, max_new_tokens=max_new_tokens, do_sample=False)
        new = found[0, given.input_ids.shape[1] :].tolist()
        ended = [i for i, token in enumerate(new) if token in self.ends]
        self.last = new[: ended[0] + 1] if ended else new  # up to the first </s>, as the endpoint counts
        self.tokens += len(self.last)
        return self.tokenizer.decode(new, skip_special_tokens=True)

    def caller(self, texts: Sequence[str], max_new_tokens: int) -> Callable[[], None]:
        """Each call generates for the next prompt, cycling through ``texts``."""
        turn = itertools.count()

        def call() -> None:
            self.answer(texts[next(turn) % len(texts)], max_new_tokens)

        return call


class GenAI:
    """OpenVINO GenAI's pipeline in this process over the served version folder's IR, as the Triton
    model opens it (float32, a prefix cache): each call generates greedily for the next ``at_once``
    prompts together, and counts their tokens up to an end-of-sequence id. The ceiling of the openvino
    engine: what the endpoint would make with no router, no Triton, no streams."""

    def __init__(self, version: Path, generate: Generate, precision: str = "fp32") -> None:
        from app.core.causal_lm_contract import BATCHED_TOKENS, CACHE_GB, MAX_RUNNING_ROWS, PRECISIONS
        from app.triton.causal_lm_openvino import open_pipeline

        properties = PRECISIONS[precision]
        self.pipeline = open_pipeline(version, 0, CACHE_GB, BATCHED_TOKENS, MAX_RUNNING_ROWS, properties)
        self.generate = generate
        self.tokens = 0

    def caller(self, texts: Sequence[str], max_new_tokens: int, at_once: int) -> Callable[[], None]:
        import numpy as np
        import openvino as ov

        from app.core.causal_lm_contract import SETTINGS
        from app.triton.causal_lm_openvino import generation_config

        settings = {**{s.name: s.default for s in SETTINGS}, "max_new_tokens": max_new_tokens, "do_sample": False}
        config = generation_config(settings, frozenset(self.generate.ends))
        prompts = [ov.Tensor(np.array([self.generate.tokenizer(t).input_ids], np.int64)) for t in texts]
        turn = itertools.count()

        def call() -> None:
            chosen = [prompts[next(turn) % len(prompts)] for _ in range(at_once)]
            for found in self.pipeline.generate(chosen, [config] * at_once):
                self.tokens += len(found.m_generation_ids[0])

        return call


def callers_of(stack: Stack, rows, texts, generate: Generate, args) -> tuple[dict[str, Callable[[], None]], dict]:
    """Each row's caller, and the checks of the first prompt's answer (reported, not asserted): the
    endpoint's whole text is ``generate``'s (ONNX Runtime's float sums may tip a near tie), the streamed
    tokens are ``generate``'s and its text the whole one, and how many tokens each made."""
    port, timeout = stack.port, args.timeout
    callers: dict[str, Callable[[], None]] = {plan.GENERATE: generate.caller(texts, args.max_new_tokens)}
    for row in rows:
        if row.side == plan.GENAI:
            callers[row.key] = args.genai.caller(texts, args.max_new_tokens, row.concurrency)
        elif row.side == plan.ENDPOINT:
            callers[row.key] = Caller(port, texts, args.max_new_tokens, False, timeout)
        elif row.side == plan.CONSTRAINED:
            callers[row.key] = Caller(port, texts, args.max_new_tokens, False, timeout, plan.CONSTRAINED_SCHEMA)
        elif row.side in (plan.TOOLS, plan.TOOLS_FREE):
            choice = "required" if row.side == plan.TOOLS else "auto"
            callers[row.key] = ToolCaller(port, texts, args.max_new_tokens, False, timeout, choice=choice)
        elif row.side == plan.STREAM:
            callers[row.key] = Caller(port, texts, args.max_new_tokens, True, timeout)
        elif row.side == plan.FOLLOW_UP:
            callers[row.key] = Caller(port, args.follow_up_texts, args.short_new_tokens, True, timeout)
        elif row.side in plan.PEERS:
            callers[row.key] = peer_caller(row, texts, generate, args)
        elif row.side in plan.PROBES:
            callers[row.key] = Caller(port, texts, args.short_new_tokens, True, timeout)
    whole_caller, stream_caller = (
        Caller(port, texts, args.max_new_tokens, stream, timeout) for stream in (False, True)
    )
    try:
        whole = whole_caller.send(whole_caller.bodies[0])
        streamed = stream_caller.send(stream_caller.bodies[0])
    except (OSError, http.client.HTTPException, RuntimeError, KeyError, TypeError, ValueError) as error:
        raise SystemExit(f"the first prompt's answer: {error}") from None
    local = generate.answer(texts[0], args.max_new_tokens)
    checks = {
        "same_as_generate": whole["generated_text"] == local,
        "stream_tokens_same_as_generate": list(streamed.ids) == generate.last,
        "stream_same_as_whole": streamed.text == whole["generated_text"],
        "tokens_of_the_first_answer": [len(generate.last), whole["generated_tokens"], len(streamed.ids)],
    }
    if args.peer is not None:
        peer = peer_caller(plan.Row(plan.LLAMA), texts, generate, args)
        try:
            ids = peer.send(peer.bodies[0])["ids"]
        except (OSError, http.client.HTTPException, RuntimeError, KeyError, TypeError, ValueError) as error:
            raise SystemExit(f"llama.cpp, the first prompt's answer: {error}") from None
        checks["llama_cpp"] = {
            "server": args.peer.describe(),
            "gguf": args.peer_gguf,
            "same_as_generate": ids == generate.last,
            "tokens": len(ids),
        }
    print(f"  the first prompt's answer: {json.dumps(checks)}", flush=True)
    return callers, checks


def peer_caller(row: plan.Row, texts: Sequence[str], generate: Generate, args) -> LlamaCaller:
    """llama.cpp's caller of ``row``: the same prompts as the router's tokenizer encodes them; the
    conversation's next turn with its prompt cache on."""
    port, timeout = args.peer.port, args.timeout
    if row.side == plan.LLAMA_FOLLOW_UP:
        prompts = [generate.tokenizer(text).input_ids for text in args.follow_up_texts]
        return LlamaCaller(port, prompts, args.short_new_tokens, True, timeout, cache_prompt=True)
    prompts = [generate.tokenizer(text).input_ids for text in texts]
    return LlamaCaller(port, prompts, args.max_new_tokens, row.side == plan.LLAMA_STREAM, timeout)


def peer_server(folder: Path, prompt_tokens: Sequence[int], generate: Generate, args) -> LlamaServer | None:
    """llama.cpp's server over ``folder`` converted (its GGUF's type kept in ``args.peer_gguf``), where a
    tree is at hand: one slot a caller, each holding the longest request (the model's positions at most)."""
    tree = llama_cpp.located(args.llama_cpp)
    if tree is None:
        print(f"llama.cpp: no tree (--llama-cpp DIR or ${llama_cpp.ENV}): its rows are left out", flush=True)
        return None
    args.peer_gguf = llama_cpp.gguf_type(args.weights)
    gguf = llama_cpp.converted(tree, folder, args.out.resolve(), args.peer_gguf)
    follow_up = max(generate.count(text) for text in args.follow_up_texts) + args.short_new_tokens
    longest = max(max(prompt_tokens) + args.max_new_tokens, follow_up)
    context = min(generate.positions or longest, -(-(longest + 16) // 256) * 256)
    return LlamaServer(tree, gguf, args.concurrency, context, args.out / "logs")


def follow_up_texts(generate: Generate, new_tokens: int) -> list[str]:
    """A conversation's turns as plain prompts: one start of ``FOLLOW_UP_SEEN`` tokens (the turns so
    far), each call's prompt that start and a turn of its own of ``FOLLOW_UP_NEW``: after the first
    call, every prompt's start is one the endpoint has run (fit to the model's positions)."""
    room = (generate.positions or 2048) - new_tokens - plan.FOLLOW_UP_NEW - 2
    start = make_texts(generate.count, min(plan.FOLLOW_UP_SEEN, room), 1, seed=2)[0]
    return [f"{start} {turn}" for turn in make_texts(generate.count, plan.FOLLOW_UP_NEW, 16, seed=3)]


def cancelled(stack: Stack) -> float:
    return endpoint.read_cancelled(requests.get(f"{stack.url}/metrics", timeout=30).text)


def load_loaded(stack: Stack, row: plan.Row, call: Caller, args) -> Load:
    """The short request, one at a time, while ``row.concurrency`` long streamed generations run
    (started first, each with its first token; cut at the end, and their cancellation awaited)."""
    before = cancelled(stack)
    longs = Caller(stack.port, call_texts(call), args.long_new, True, args.timeout)
    running = LongGenerations(longs, row.concurrency).start(args.timeout)
    try:
        load = run_load(call, 1, args.seconds)
    finally:
        running.stop()
    deadline = time.monotonic() + CANCEL_WAIT_S
    while cancelled(stack) < before + row.concurrency and time.monotonic() < deadline:
        time.sleep(0.05)
    if running.errors:
        return Load(load.latencies_s, load.errors + len(running.errors), load.window_s, load.work, running.errors[0])
    return load


def call_texts(call: Caller) -> list[str]:
    return [json.loads(b)["payload"]["text"] for b in call.bodies]


def load_of(stack: Stack, row: plan.Row, call: Callable[[], None], seconds: float, args) -> Load:
    """A row's closed loop: client threads for the endpoint, the main thread for generate."""
    if row.side in plan.LOCAL:
        return in_main_thread(call, seconds)
    if row.side == plan.SHORT_LOADED:
        return load_loaded(stack, row, call, args)
    return run_load(call, row.concurrency, seconds)


def local_side(row: plan.Row, generate: Generate, args) -> Any:
    """The object that counts an in-process row's tokens (``generate``, or the GenAI pipeline)."""
    return args.genai if row.side == plan.GENAI else generate


def counted(row: plan.Row, call: Any, generate: Generate, since: int, args) -> dict[str, Any]:
    """What a step's calls made: its tokens and, streamed, each answer's times (first token, gaps)."""
    if row.side in plan.LOCAL:
        return {"tokens": local_side(row, generate, args).tokens - since}
    added = call.records[since:]
    if row.side in plan.WHOLE:
        return {"tokens": sum(result["generated_tokens"] for result in added)}
    return {
        "tokens": sum(len(record.arrivals) for record in added),
        "ttft_s": [record.ttft_s for record in added if record.ttft_s is not None],
        "gaps_s": [gap for record in added for gap in record.gaps_s],
    }


def measure(stack: Stack, rows, texts, generate: Generate, args) -> tuple[dict, dict, dict]:
    """Warm the rows, then the interleaved rounds. Per row a Cell a round (calls, latencies, CPU
    seconds by role) and what the round's calls made (``counted``)."""
    callers, checks = callers_of(stack, rows, texts, generate, args)
    meter = CpuMeter(stack)
    print(f"warming up {len(rows) - 1} rows ({args.warmup_seconds:g} s each) ...", flush=True)
    for row in rows:
        if args.warmup_seconds > 0 and row.side != plan.SHORT_LOADED:  # warmed by the others
            load_of(stack, row, callers[row.key], args.warmup_seconds, args)
    cells: dict[str, list[Cell]] = {row.key: [] for row in rows}
    counts: dict[str, list[dict[str, Any]]] = {row.key: [] for row in rows}
    steps = schedule(rows, args.rounds)
    progress = Progress(len(steps))
    for r, row in steps:
        call = callers[row.key]
        since = local_side(row, generate, args).tokens if row.side in plan.LOCAL else len(call.records)
        before, started = {**meter(), **own_and_machine()}, time.perf_counter()
        load = load_of(stack, row, call, args.seconds, args)
        wall, after = time.perf_counter() - started, {**meter(), **own_and_machine()}
        cell = Cell()
        cell.add(load.latencies_s, load.errors, wall, len(load.latencies_s), load.first_error)
        cell.cpu_s = {role: after[role] - before[role] for role in after}
        cells[row.key].append(cell)
        counts[row.key].append(counted(row, call, generate, since, args))
        progress.step(report.progress_label(r, args.rounds, row, cell, counts[row.key][-1]), cell.summary())
    return cells, counts, checks


def main(argv: Sequence[str] | None = None) -> int:
    args = plan.parse_args(argv)
    served_as = {"shape": args.shape, "engine": args.engine, "weights": args.weights, "precision": args.precision}
    spec = prepare.ready(args.out.resolve(), args.repository, args.small, not args.no_prepare, **served_as)
    folder = prepared.sources(args.out.resolve(), args.small) / plan.MODEL / "hf"
    print(f"loading AutoModelForCausalLM({folder}) for the in-process side ...", flush=True)
    generate = Generate(folder)
    if args.generate_threads:
        import torch

        torch.set_num_threads(args.generate_threads)
    texts = make_texts(generate.count, args.text_tokens, args.texts, seed=1)
    prompt_tokens = [generate.count(text) for text in texts]
    args.follow_up_texts = follow_up_texts(generate, args.short_new_tokens)
    args.long_new = plan.long_tokens(args.long_new_tokens, generate.positions, max(prompt_tokens))
    args.peer = peer_server(folder, prompt_tokens, generate, args)
    rows = plan.plan_rows(args.concurrency, args.engine, peer=args.peer is not None)
    # the openvino engine's ceiling: its pipeline in this process (the rows' local side, as generate)
    version = args.repository / plan.MODEL / "1"
    args.genai = GenAI(version, generate, args.precision) if args.engine == "openvino" else None
    with serving(args.repository, args.out, args.env) as stack, args.peer.running() if args.peer else nullcontext():
        cells, counts, checks = measure(stack, rows, texts, generate, args)
        sizing = sizing_line(stack)
    found: dict[str, Any] = report.results(rows, cells, counts, args, stack.start_to_ping_s or 0.0)
    found.update(
        sizing=sizing,
        served=str(spec.folder),
        generate_folder=str(folder),
        generate_threads=generate.threads,
        prompt_tokens=sum(prompt_tokens) / len(prompt_tokens),
        checks=checks,
    )
    write_results(
        args.out / "results.json",
        found,
        report.format_table(found["rows"]),
        report.format_verdicts(found["verdicts"], found["checks"]),
        noise_lines([row for row in found["rows"] if row["side"] not in plan.PROBES]),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
