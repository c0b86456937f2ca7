"""What the text benchmark measures, decided before anything starts: its arguments, its rows (one
per family and text length, and the embeddings comparison's three sides), the order of the steps
(interleaved round by round, so that drift hits every row alike) and the texts of each row (made to
a token count with the model's own tokenizer, so that "short" and "long" mean the same for each)."""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import PROJECT_ROOT
from scripts.bench.constants import QUICK_HELP, QUICK_RUN
from scripts.terminal import positive

DEFAULT_OUT = PROJECT_ROOT / "build" / "bench-text"
FILL_MASK, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, SENTENCE_EMBEDDING = (
    "fill_mask",
    "text_classification",
    "token_classification",
    "sentence_embedding",
)
FAMILIES = (FILL_MASK, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, SENTENCE_EMBEDDING)
NEW_FAMILIES = FAMILIES[1:]  # the reference is bert_base's fill-mask
# The model serving each family in the benchmark's repository.
MODELS = {
    FILL_MASK: "bert_base",
    TEXT_CLASSIFICATION: "bench_sentiment",
    TOKEN_CLASSIFICATION: "bench_ner",
    SENTENCE_EMBEDDING: "bench_minilm",
}
SHORT, LONG = "short", "long"
LENGTHS = (SHORT, LONG)
SHORT_TOKENS = 10  # special tokens included, as the product's limit counts them
BATCH_TEXTS = 32  # texts per request of the batch side, and encode(batch_size=...) in one process
HTTP, ENCODE = "http", "encode"
BATCH_SIDE, SINGLE_SIDE, ENCODE_SIDE = "batch", "single", "encode"
DEFAULT_CONCURRENCY, SINGLE_CONCURRENCY = 8, 16
# The goals of the issue: router CPU per request of a new family at most the fill-mask's + 0.3 ms;
# requests of 32 texts at least encode()'s texts/s; single-text requests at concurrency 16 at least half.
CPU_MARGIN_MS, BATCH_GOAL, SINGLE_GOAL = 0.3, 1.0, 0.5
# Common words, each one token of bert-base-uncased's vocabulary, and names for the NER model to find.
WORDS = (
    *("the", "a", "man", "woman", "child", "city", "river", "house", "music", "bread", "morning", "evening"),
    *("quickly", "slowly", "green", "old", "new", "small", "large", "walks", "reads", "plays", "sees", "near"),
    *("under", "after", "before", "with", "and", "good", "bad", "day", "night", "car", "train", "dog", "horse"),
    *("food", "water", "people", "market", "north", "south", "company", "school", "street", "garden", "window"),
    *("letter", "story", "friend", "family", "John", "Mary", "Paris", "London", "Berlin", "Google", "Europe"),
)


@dataclass(frozen=True)
class Row:
    """One measured row: a family at a text length, as single-text requests through the public port
    (``side`` ""), or a side of the embeddings comparison (``batch``, ``single``, ``encode``)."""

    family: str
    length: str
    texts: int  # texts per request (per encode() call)
    concurrency: int  # client threads (encode: one)
    side: str = ""

    @property
    def key(self) -> str:
        return f"{self.family}/{self.length}" + (f"/{self.side}" if self.side else "")

    @property
    def kind(self) -> str:
        return ENCODE if self.side == ENCODE_SIDE else HTTP


def plan_rows(lengths: Sequence[str], concurrency: int, single_concurrency: int) -> list[Row]:
    """Every family at every length (one text a request), then the embeddings comparison at every
    length: requests of 32 texts, single-text requests at ``single_concurrency``, encode() in this process."""
    rows = [Row(family, length, 1, concurrency) for length in lengths for family in FAMILIES]
    for length in lengths:
        rows += [
            Row(SENTENCE_EMBEDDING, length, BATCH_TEXTS, concurrency, BATCH_SIDE),
            Row(SENTENCE_EMBEDDING, length, 1, single_concurrency, SINGLE_SIDE),
            Row(SENTENCE_EMBEDDING, length, BATCH_TEXTS, 1, ENCODE_SIDE),
        ]
    return rows


def schedule(rows: Sequence[Row], rounds: int) -> list[tuple[int, Row]]:
    """(round, row) in the order they run: every row once a round, the order rotated by one each
    round so that no row always follows the same one (A B C, B C A, ...)."""
    steps = []
    for r in range(rounds):
        shift = r % len(rows) if rows else 0
        steps += [(r, row) for row in [*rows[shift:], *rows[:shift]]]
    return steps


def long_target(limit: int) -> int:
    """A long text's tokens: near the model's limit, in its top length bucket (512 -> 496, 128 -> 124)."""
    return max(2, limit - max(2, limit // 32))


def fit_text(count: Callable[[str], int], target: int, words: Sequence[str], mask: bool = False) -> str:
    """The longest prefix of ``words`` (with ``[MASK]`` in its middle for a fill-mask model, and a full
    stop) whose token count is at most ``target``, by bisection (the count grows with the prefix)."""

    def text(n: int) -> str:
        chosen = list(words[:n])
        if mask:
            chosen.insert(n // 2, "[MASK]")
        return " ".join(chosen) + "."

    low, high = 1, len(words)  # text(low) is kept even when over: a text has at least one word
    while low < high:
        middle = (low + high + 1) // 2
        if count(text(middle)) <= target:
            low = middle
        else:
            high = middle - 1
    return text(low)


def make_texts(count: Callable[[str], int], target: int, n: int, seed: int = 0, mask: bool = False) -> list[str]:
    """``n`` different texts of about ``target`` tokens (by ``count``, the model's tokenizer), seeded."""
    rng = random.Random(seed)
    return [fit_text(count, target, [rng.choice(WORDS) for _ in range(target)], mask) for _ in range(n)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.text",
        description="The text families through the public port: throughput, the router's CPU per request "
        "against bert_base's fill-mask, short and long texts, and the embeddings against SentenceTransformer.encode.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results.json, the model sources and logs go here")
    p.add_argument("--repository", type=Path, help="the repository to prepare and serve (default: OUT/repository)")
    p.add_argument("--no-prepare", action="store_true", help="serve --repository as it is (it holds the 4 models)")
    p.add_argument(
        "--small",
        action="store_true",
        help="tiny models (scripts.model_prep.small_models, build/test-models' bert_base) instead of the realistic ones: "
        "a smoke run of the benchmark itself",
    )
    p.add_argument("--seconds", type=positive(float), default=5.0, help="seconds of load per row per round")
    p.add_argument("--rounds", type=positive(int), default=3, help="interleaved rounds")
    p.add_argument(
        "--warmup-seconds",
        type=positive(float, zero=True),
        default=2.0,
        help="unmeasured load per row before the rounds",
    )
    p.add_argument("--concurrency", type=positive(int), default=DEFAULT_CONCURRENCY, help="client threads of each row")
    p.add_argument(
        "--single-concurrency",
        type=positive(int),
        default=SINGLE_CONCURRENCY,
        help="client threads of the embeddings' single-text side of the comparison",
    )
    p.add_argument("--lengths", default=",".join(LENGTHS), help="comma-separated: short (10 tokens), long")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for serve, e.g. TRITON_THREADS=bench_minilm=2 (another sizing); repeatable",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    p.add_argument("--quick", action="store_true", help=QUICK_HELP)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as results.json records it
    if args.quick:
        args.rounds, args.seconds, args.warmup_seconds = QUICK_RUN
    args.lengths = [length for length in args.lengths.split(",") if length]
    unknown = sorted(set(args.lengths) - set(LENGTHS))
    if unknown or not args.lengths:
        p.error(f"--lengths: {', '.join(unknown) or 'none given'}; choose from {', '.join(LENGTHS)}")
    args.env = [tuple(entry.split("=", 1)) for entry in args.env]
    if any(len(entry) != 2 or not entry[0] for entry in args.env):
        p.error("--env: expected NAME=VALUE")
    args.repository = (args.repository or args.out / "repository").resolve()
    return args
