"""What the generation benchmark measures, decided before anything starts: its arguments, its rows
(the endpoint at two concurrencies, ``generate`` in this process at two batch sizes, beam search on
both sides) and the texts (made to a token count with the model's own tokenizer)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.generation_contract import MAX_BEAMS, MAX_NEW_TOKENS
from app.core.settings import PROJECT_ROOT
from scripts.bench.constants import QUICK_HELP, QUICK_RUN
from scripts.terminal import positive

DEFAULT_OUT = PROJECT_ROOT / "build" / "bench-generation"
MODEL = "bench_t5"  # the model's name in the benchmark's repository
ENDPOINT, GENERATE = "endpoint", "generate"  # through the public port; model.generate in this process
TEXTS, TEXT_TOKENS = 32, 20  # the texts every row cycles through, and their tokens (</s> included)
MAX_NEW = 32  # tokens generated a text (min_new_tokens the same: no text ends early)
CONCURRENCY, BATCH, BEAMS = 8, 8, 4
GOAL = 1.5  # the endpoint at concurrency 8 against generate at batch 1, generated tokens/s
PROG = "python -m scripts.bench.generation"
DESCRIPTION = (
    "The text2text family through the public port against model.generate in one process: requests/s, "
    "generated tokens/s, latency and CPU, greedy and beam search, on a t5-small-sized T5."
)
ENV_HELP = f"an environment variable for serve, e.g. TRITON_THREADS={MODEL}=2 (another sizing); repeatable"


@dataclass(frozen=True)
class Row:
    """One measured row: single-text requests through the public port at ``concurrency`` client
    threads, or ``generate`` in this process on ``batch`` texts a call (one thread); greedy search,
    or beam search with ``beams`` beams."""

    side: str
    concurrency: int
    batch: int = 1
    beams: int = 1

    @property
    def key(self) -> str:
        where = f"c{self.concurrency}" if self.side == ENDPOINT else f"b{self.batch}"
        return f"{self.side}/{where}/{'greedy' if self.beams == 1 else f'beam{self.beams}'}"

    @property
    def label(self) -> str:
        search = "greedy" if self.beams == 1 else f"beam search ({self.beams} beams)"
        if self.side == ENDPOINT:
            return f"endpoint, one text a request, c={self.concurrency}, {search}"
        return f"model.generate, batch {self.batch}, one process, {search}"


def plan_rows(concurrency: int, batch: int, beams: int) -> list[Row]:
    """The endpoint at ``concurrency`` and at 1, ``generate`` at batch 1 and ``batch``, greedy; with
    ``beams`` above 1, beam search through the endpoint at ``concurrency`` and in ``generate`` at batch 1."""
    rows = [Row(ENDPOINT, concurrency), Row(ENDPOINT, 1), Row(GENERATE, 1), Row(GENERATE, 1, batch)]
    if beams > 1:
        rows += [Row(ENDPOINT, concurrency, beams=beams), Row(GENERATE, 1, beams=beams)]
    return list(dict.fromkeys(rows))  # concurrency 1 or batch 1 asked for: a row once


def goal_rows(concurrency: int, batch: int, beams: int) -> dict[str, tuple[Row, Row]]:
    """The comparisons the verdicts make: (the endpoint's row, generate's row) by name."""
    pairs = {
        "goal": (Row(ENDPOINT, concurrency), Row(GENERATE, 1)),
        "batch": (Row(ENDPOINT, concurrency), Row(GENERATE, 1, batch)),
    }
    if beams > 1:
        pairs["beam"] = (Row(ENDPOINT, concurrency, beams=beams), Row(GENERATE, 1, beams=beams))
    return pairs


def payload_settings(max_new_tokens: int, beams: int) -> dict[str, int]:
    """The generation settings of every call, either side: exactly ``max_new_tokens`` tokens a text."""
    return {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens, "num_beams": beams}


def env_entry(entry: str) -> tuple[str, str]:
    """``--env NAME=VALUE`` as (NAME, VALUE); only the first "=" splits."""
    name, equals, value = entry.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {entry!r}")
    return name, value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--out", type=Path, default=DEFAULT_OUT, help="results.json, the model's sources, the cache and logs go here")
    add("--repository", type=Path, help="the repository to prepare and serve (default: OUT/repository)")
    add("--no-prepare", action="store_true", help=f"serve --repository as it is (it holds {MODEL})")
    add(
        "--small", action="store_true", help="a tiny T5 (scripts.model_prep.small_models): a smoke run of the benchmark"
    )
    add("--seconds", type=positive(float), default=10.0, help="seconds of load per row per round")
    add("--rounds", type=positive(int), default=3, help="interleaved rounds")
    add("--warmup-seconds", type=positive(float, zero=True), default=3.0, help="unmeasured load per row first")
    add("--concurrency", type=positive(int), default=CONCURRENCY, help="client threads of the endpoint's rows")
    add("--batch", type=positive(int), default=BATCH, help="texts a call of generate's batched row")
    add(
        "--beams", type=int, default=BEAMS, help=f"beam search rows with this many beams (0 or 1: none; <= {MAX_BEAMS})"
    )
    add("--texts", type=positive(int), default=TEXTS, help="different texts each row cycles through")
    add("--text-tokens", type=positive(int), default=TEXT_TOKENS, help="tokens a text, </s> included")
    add("--max-new-tokens", type=positive(int), default=MAX_NEW, help="tokens generated a text (min_new_tokens too)")
    add("--env", type=env_entry, action="append", default=[], metavar="NAME=VALUE", help=ENV_HELP)
    add("--timeout", type=float, default=120.0, help="seconds one request may take")
    add("--quick", action="store_true", help=QUICK_HELP)
    args = p.parse_args(argv)
    if not 0 <= args.beams <= MAX_BEAMS or args.max_new_tokens > MAX_NEW_TOKENS:
        p.error(f"--beams: from 0 to {MAX_BEAMS}; --max-new-tokens: at most {MAX_NEW_TOKENS} (the family's bounds)")
    args.rounds, args.seconds, args.warmup_seconds = (
        QUICK_RUN if args.quick else (args.rounds, args.seconds, args.warmup_seconds)
    )
    args.repository = (args.repository or args.out / "repository").resolve()
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as results.json records it
    return args
