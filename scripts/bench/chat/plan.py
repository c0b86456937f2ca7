"""What the chat benchmark measures, decided before anything starts: its arguments, its rows (the
endpoint at two concurrencies, streamed callers, a short request's time to first token alone and
beside long generations, answers constrained to a JSON Schema, chat answers that must call a tool,
``generate`` in this process at batch 1) and the comparisons they feed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.causal_lm_contract import ENGINES, MAX_NEW_TOKENS, PRECISIONS, WEIGHT_FORMATS
from app.core.settings import PROJECT_ROOT
from scripts.bench.constants import QUICK_HELP, QUICK_RUN
from scripts.bench.generation.plan import env_entry
from scripts.terminal import positive

DEFAULT_OUT = PROJECT_ROOT / "build" / "bench-chat"
MODEL = "bench_llama"  # the model's name in the benchmark's repository
SHAPES = ("llama-34m", "smollm2-135m", "llama-580m-32k")  # --shape: scripts.bench.chat.prepare.SHAPES
GENERATE, ENDPOINT, STREAM, SHORT_ALONE, SHORT_LOADED = "generate", "endpoint", "stream", "short-alone", "short-loaded"
GENAI = "genai"  # --engine openvino: OpenVINO GenAI's pipeline in this process over the served IR, the ceiling
LOCAL = (GENERATE, GENAI)  # the sides that run in this process, the stack idle
FOLLOW_UP = "follow-up"  # a conversation's next turn: a long prompt whose start every earlier call sent
# llama.cpp's server, where a tree is at hand (scripts.bench.chat.llama_cpp): whole answers, streamed, the next turn
LLAMA, LLAMA_STREAM, LLAMA_FOLLOW_UP = "llama.cpp", "llama.cpp-stream", "llama.cpp-follow-up"
PEERS = (LLAMA, LLAMA_STREAM, LLAMA_FOLLOW_UP)
PROBES = (SHORT_ALONE, SHORT_LOADED, FOLLOW_UP, LLAMA_FOLLOW_UP)  # one short streamed request at a time
# whole answers constrained to CONSTRAINED_SCHEMA (the envelope's json_schema; the onnxruntime engine's)
CONSTRAINED = "json-schema"
CONSTRAINED_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
# whole chat answers to the same prompts that must call TOOL (OpenAI's tools, tool_choice "required": a
# grammar of the call's markup with the tool's parameters inline; the onnxruntime engine's), and the same
# bodies free to answer text (tool_choice "auto": the same prompt, with the tools, and no grammar)
TOOLS, TOOLS_FREE = "tool-calls", "tools-auto"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Looks a phrase up.",
        "parameters": {
            "type": "object",
            "properties": {"phrase": {"type": "string"}, "exact": {"type": "boolean"}},
            "required": ["phrase", "exact"],
            "additionalProperties": False,
        },
    },
}
GOAL_CONSTRAINED = 0.8  # constrained rows against the same calls unconstrained, tokens/s: at least
WHOLE = (ENDPOINT, LLAMA, CONSTRAINED, TOOLS, TOOLS_FREE)  # the sides whose calls answer whole (tokens counted)
GOAL_PEER = 1.0  # the endpoint against llama.cpp's server: its tokens/s at least, its first token's wait at most
FOLLOW_UP_SEEN, FOLLOW_UP_NEW = 768, 24  # its tokens sent before (the earlier turns), and the turn's own
TEXTS, TEXT_TOKENS = 32, 24  # the prompts every row cycles through, and their tokens (<s> included)
MAX_NEW = 64  # tokens generated a prompt (random weights never end one early: prepare)
SHORT_NEW, LONG_NEW = 8, 256  # the short request's tokens, and those of the long generations beside it
CONCURRENCY = 8
GOAL_TOKENS = 3.0  # the endpoint at concurrency 8 against generate at batch 1, generated tokens/s: at least
GOAL_TTFT = 3.0  # a short request's time to first token beside the long generations against alone: at most
PROG = "python -m scripts.bench.chat"
DESCRIPTION = (
    "The text_generation family through the public port against model.generate in one process: generated "
    "tokens/s, time to first token and inter-token latency, on a Llama-style model of about 34M parameters."
)


@dataclass(frozen=True)
class Row:
    """One measured row. ``generate``: ``model.generate`` in this process, one prompt a call;
    ``endpoint``: whole answers through the public port at ``concurrency`` client threads;
    ``stream``: streamed answers, each event's arrival timed; ``short-alone`` / ``short-loaded``: one
    short streamed request at a time, alone or while ``concurrency`` long streamed generations run."""

    side: str
    concurrency: int = 1

    @property
    def key(self) -> str:
        return self.side if self.side in (GENERATE, *PROBES) else f"{self.side}/c{self.concurrency}"

    def label(self, max_new: int, short_new: int, long_new: int) -> str:
        if self.side == GENERATE:
            return f"model.generate, batch 1, one process, {max_new} tokens"
        if self.side == GENAI:
            return f"OpenVINO GenAI in this process, {self.concurrency} prompt(s) at once, {max_new} tokens"
        if self.side == ENDPOINT:
            return f"endpoint, whole answers, c={self.concurrency}, {max_new} tokens"
        if self.side == CONSTRAINED:
            return f"endpoint, whole answers to a JSON Schema, c={self.concurrency}, {max_new} tokens at most"
        if self.side == TOOLS:
            return f"endpoint, chat answers that must call a tool, c={self.concurrency}, {max_new} tokens at most"
        if self.side == TOOLS_FREE:
            return f"endpoint, chat answers free to call a tool, c={self.concurrency}, {max_new} tokens"
        if self.side == STREAM:
            return f"endpoint, streamed, c={self.concurrency}, {max_new} tokens"
        if self.side == LLAMA:
            return f"llama.cpp server, whole answers, c={self.concurrency}, {max_new} tokens"
        if self.side == LLAMA_STREAM:
            return f"llama.cpp server, streamed, c={self.concurrency}, {max_new} tokens"
        if self.side == SHORT_ALONE:
            return f"short request alone, streamed, {short_new} tokens"
        if self.side in (FOLLOW_UP, LLAMA_FOLLOW_UP):
            return (
                f"{'llama.cpp server, ' if self.side == LLAMA_FOLLOW_UP else ''}a conversation's next turn "
                f"({FOLLOW_UP_SEEN} tokens sent before, {FOLLOW_UP_NEW} new), streamed, {short_new} tokens"
            )
        return f"short request beside {self.concurrency} of {long_new} tokens, streamed, {short_new} tokens"


def plan_rows(concurrency: int, engine: str = ENGINES[0], peer: bool = False) -> list[Row]:
    """``generate`` at batch 1; the endpoint at ``concurrency`` and at 1; streamed at ``concurrency``;
    the short request alone and beside ``concurrency - 1`` long generations (``concurrency`` requests
    in all, as the streamed row); a conversation's next turn, alone; on the openvino engine, its
    pipeline in this process with 1 and ``concurrency`` prompts at once, else (the onnxruntime engine,
    which follows grammars) answers constrained to a JSON Schema, and chat answers with a tool that must
    call it and that may, at ``concurrency``; with ``peer``,
    llama.cpp's server as the endpoint is called: whole at 1 and ``concurrency``, streamed, the next turn."""
    grammars = [Row(CONSTRAINED, concurrency), Row(TOOLS, concurrency), Row(TOOLS_FREE, concurrency)]
    ceiling = [Row(GENAI, 1), Row(GENAI, concurrency)] if engine == "openvino" else grammars
    if peer:
        ceiling += [Row(LLAMA, concurrency), Row(LLAMA, 1), Row(LLAMA_STREAM, concurrency), Row(LLAMA_FOLLOW_UP)]
    rows = [
        Row(GENERATE),
        Row(ENDPOINT, concurrency),
        Row(ENDPOINT, 1),
        Row(STREAM, concurrency),
        Row(SHORT_ALONE),
        Row(SHORT_LOADED, max(1, concurrency - 1)),
        Row(FOLLOW_UP),
        *ceiling,
    ]
    return list(dict.fromkeys(rows))  # concurrency 1 asked for: the endpoint's row once


def goal_rows(concurrency: int) -> dict[str, tuple[Row, Row]]:
    """The comparisons the verdicts make: (the measured row, its reference) by name."""
    return {
        "tokens": (Row(ENDPOINT, concurrency), Row(GENERATE)),
        "ttft": (Row(SHORT_LOADED, max(1, concurrency - 1)), Row(SHORT_ALONE)),
        "constrained": (Row(CONSTRAINED, concurrency), Row(ENDPOINT, concurrency)),
        "tools": (Row(TOOLS, concurrency), Row(TOOLS_FREE, concurrency)),
    }


def peer_rows(concurrency: int) -> list[tuple[str, Row, Row]]:
    """The comparisons with llama.cpp's server (goal ``GOAL_PEER``): (what is compared, the endpoint's
    row, the peer's)."""
    return [
        *(("tokens_per_s", Row(ENDPOINT, c), Row(LLAMA, c)) for c in dict.fromkeys((1, concurrency))),
        ("ttft_p50_ms", Row(STREAM, concurrency), Row(LLAMA_STREAM, concurrency)),
        ("ttft_p50_ms", Row(FOLLOW_UP), Row(LLAMA_FOLLOW_UP)),
    ]


def long_tokens(asked: int, positions: int | None, prompt_tokens: int) -> int:
    """The long generations' tokens: as asked, unless the model's positions hold fewer after the
    longest prompt (the small model's 128)."""
    return asked if positions is None else max(1, min(asked, positions - prompt_tokens))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--out", type=Path, default=DEFAULT_OUT, help="results.json, the model's sources, the cache and logs go here")
    add("--repository", type=Path, help="the repository to prepare and serve (default: OUT/repository)")
    add("--no-prepare", action="store_true", help=f"serve --repository as it is (it holds {MODEL})")
    add("--small", action="store_true", help="a tiny Llama (scripts.model_prep.small_models): a smoke run")
    add(
        "--shape",
        choices=SHAPES,
        default=SHAPES[0],
        help="the benchmark Llama's sizes (smollm2-135m: SmolLM2-135M's; llama-580m-32k: over 2 GB, 32k positions)",
    )
    add("--engine", choices=ENGINES, default=ENGINES[0], help="what steps the running batch ([export] engine)")
    add(
        "--weights",
        choices=WEIGHT_FORMATS,
        default=WEIGHT_FORMATS[0],
        help="the weights' format (int8, int4: --engine openvino)",
    )
    add(
        "--precision",
        choices=tuple(PRECISIONS),
        default="fp32",
        help="the arithmetic ([export] precision; bf16: --engine openvino)",
    )
    add("--seconds", type=positive(float), default=10.0, help="seconds of load per row per round")
    add("--rounds", type=positive(int), default=4, help="interleaved rounds (two moved the ratio by a quarter)")
    add("--warmup-seconds", type=positive(float, zero=True), default=2.0, help="unmeasured load per row first")
    add("--concurrency", type=positive(int), default=CONCURRENCY, help="client threads of the loaded rows")
    add("--texts", type=positive(int), default=TEXTS, help="different prompts each row cycles through")
    add("--text-tokens", type=positive(int), default=TEXT_TOKENS, help="tokens a prompt, <s> included")
    add("--max-new-tokens", type=positive(int), default=MAX_NEW, help="tokens generated a prompt, greedy")
    add("--short-new-tokens", type=positive(int), default=SHORT_NEW, help="tokens of the short request")
    add("--long-new-tokens", type=positive(int), default=LONG_NEW, help="tokens of the long generations beside it")
    add(
        "--generate-threads",
        type=positive(int),
        help="PyTorch's threads for generate in this process (default: PyTorch's own, every CPU)",
    )
    add(
        "--env",
        type=env_entry,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for serve",
    )
    add(
        "--llama-cpp",
        type=Path,
        metavar="DIR",
        help="a llama.cpp source tree with build/bin/llama-server, run as a peer (default: $LLAMA_CPP_DIR; "
        "neither: no peer rows)",
    )
    add("--timeout", type=float, default=120.0, help="seconds one request may take")
    add("--quick", action="store_true", help=QUICK_HELP)
    args = p.parse_args(argv)
    for option, value, default in (("weights", args.weights, WEIGHT_FORMATS[0]), ("precision", args.precision, "fp32")):
        if value != default and args.engine != "openvino":
            p.error(f"--{option} {value}: only with --engine openvino")
    if max(args.max_new_tokens, args.short_new_tokens, args.long_new_tokens) > MAX_NEW_TOKENS:
        p.error(f"new tokens: at most {MAX_NEW_TOKENS} (the family's bound)")
    args.rounds, args.seconds, args.warmup_seconds = (
        QUICK_RUN if args.quick else (args.rounds, args.seconds, args.warmup_seconds)
    )
    args.repository = (args.repository or args.out / "repository").resolve()
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as results.json records it
    return args
