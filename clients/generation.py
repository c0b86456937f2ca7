"""One prompt's generation as the router follows it: Triton's token stream, decoded as it comes.

``Generation`` wraps the stream of one request to a decoupled ``text_generation`` model
(``clients.triton.TritonClient.stream``, or a stand-in with the same shape): iterating it gives
each generated ``Token`` with the text it makes final (``clients.text_stream``); a stop sequence
found in the text ends the generation there and cancels the stream; ``close()`` (a caller gone, an
error) cancels it too. What it ends with: ``finish_reason`` (TGI's words: ``eos_token``,
``length``, ``stop_sequence``), the token count, the text, and its timings (time to the first
token, tokens per second) for the metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core.access import (
    CONSTRAINED,
    GENERATED_TOKENS,
    GENERATION_CANCELLED,
    TIME_TO_FIRST_TOKEN,
    TOKENS_PER_SECOND,
    TOOL_CALLS,
)
from app.core.causal_lm_contract import (
    ALTERNATIVE_IDS,
    ALTERNATIVE_LOGPROBS,
    LOGPROB,
    PROMPT_ALTERNATIVE_IDS,
    PROMPT_ALTERNATIVE_LOGPROBS,
    PROMPT_LOGPROBS,
    TOKEN_ID,
)
from app.core.family import Counter, Measure
from clients.text_stream import TextStream

EOS, LENGTH, STOP_SEQUENCE = "eos_token", "length", "stop_sequence"


@dataclass(frozen=True)
class Token:
    """A generated token: its id, the text it makes final (joined, the answer), its log-probability,
    and whether it is a special token (skipped by the decode; one that releases text held back
    before it is not marked special, so that callers that skip special tokens' text keep it)."""

    id: int
    text: str
    logprob: float
    special: bool
    last: bool = False  # the generation's last: its finish_reason is set
    top: tuple[tuple[int, float], ...] = ()  # the likeliest tokens and their log-probabilities, where asked


class Generation:
    """The tokens of one request as they come (one thread reads it)."""

    def __init__(
        self,
        stream: Any,
        text: TextStream,
        *,
        prompt_tokens: int,
        max_new_tokens: int,
        end_ids: frozenset[int],
        special_ids: frozenset[int],
        seed: int | None = None,
        prompt_ids: Sequence[int] = (),
        last_prompt_id: int | None = None,
    ) -> None:
        self.stream = stream
        self.text_stream = text
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.end_ids = end_ids
        self.special_ids = special_ids
        self.seed = seed
        self.tokens: list[Token] = []
        self.prompt_ids = tuple(prompt_ids)  # where the prompt's log-probabilities were asked
        self.last_prompt_id = last_prompt_id  # the token before the first generated (a token's text after it)
        self.prefill: list[Token] = []  # then the prompt's tokens, with them (the first has none: NaN)
        self.finish_reason: str | None = None
        self.started = time.perf_counter()
        self.first_token_s: float | None = None  # seconds from the start to the first token
        self.elapsed_s: float | None = None  # seconds from the start to the end

    @property
    def text(self) -> str:
        """The generated text so far (final once ``finish_reason`` is set)."""
        return self.text_stream.text

    @property
    def version(self) -> str:
        return str(getattr(self.stream, "version", "") or "")

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens after the first, per second after the first (the decode's pace)."""
        if self.first_token_s is None or self.elapsed_s is None or len(self.tokens) < 2:
            return None
        span = self.elapsed_s - self.first_token_s
        return (len(self.tokens) - 1) / span if span > 0 else None

    def __iter__(self) -> Iterator[Token]:
        """Each token as it comes; the last carries what the text held back. Errors are the router's
        (``clients.triton``'s translation)."""
        try:
            for outputs in self.stream:
                yield from self._tokens(outputs)
                if self.finish_reason is not None:
                    return
            if self.finish_reason is None:  # the final flag came alone, after the last token's answer:
                self._finish()  # what the text held back goes on a token of its own, marked last
                rest = self.text_stream.finish()
                last = self.tokens[-1].id if self.tokens else -1
                yield Token(last, rest, 0.0, not rest, last=True)
        finally:
            if self.finish_reason is None:  # left before the end: the generation is not needed
                self.close()

    def _tokens(self, outputs: dict[str, np.ndarray]) -> Iterator[Token]:
        if self.prompt_ids and not self.prefill:
            self.prefill = prompt_tokens(self.prompt_ids, outputs, self.special_ids)
        ids = np.asarray(outputs[TOKEN_ID]).reshape(-1).tolist()
        logprobs = np.asarray(outputs[LOGPROB]).reshape(-1).tolist()
        if self.first_token_s is None and ids:
            self.first_token_s = time.perf_counter() - self.started
        piece = self.text_stream.push(ids)
        stopped = self.text_stream.stopped is not None
        done = stopped or bool(getattr(self.stream, "done", False))
        if done:
            self._finish()
            piece += self.text_stream.finish()
            if stopped:
                self.close()
        made = [
            Token(token, "", float(logprob), token in self.special_ids)
            for token, logprob in zip(ids, logprobs, strict=False)
        ]
        top = alternatives(outputs) if len(made) == 1 else ()  # a response of one token carries them
        if made:  # the text goes on the last token; one that carries text is not skipped as special
            last = made[-1]
            made[-1] = Token(last.id, piece, last.logprob, last.special and not piece, last=done, top=top)
        self.tokens.extend(made)
        yield from made

    def _finish(self) -> None:
        self.elapsed_s = time.perf_counter() - self.started
        ids = self.text_stream.ids
        if self.text_stream.stopped is not None:
            self.finish_reason = STOP_SEQUENCE
        elif ids and ids[-1] in self.end_ids and len(ids) <= self.max_new_tokens:
            self.finish_reason = EOS
        else:
            self.finish_reason = LENGTH

    def collect(self) -> Generation:
        """Every token (a whole answer, not streamed)."""
        for _ in self:
            pass
        return self

    def close(self) -> None:
        """Cancels the stream: Triton stops generating for it."""
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()


def alternatives(outputs: dict[str, np.ndarray]) -> tuple[tuple[int, float], ...]:
    """A response's alternatives (``top_logprobs`` asked): its likeliest tokens and their log-probabilities."""
    ids, values = outputs.get(ALTERNATIVE_IDS), outputs.get(ALTERNATIVE_LOGPROBS)
    if ids is None or values is None:
        return ()
    return tuple(zip(np.asarray(ids).reshape(-1).tolist(), np.asarray(values).reshape(-1).tolist()))


def prompt_tokens(ids: Sequence[int], outputs: dict[str, np.ndarray], special: frozenset[int]) -> list[Token]:
    """The prompt's tokens with the log-probabilities of a first response (``PROMPT_LOGPROBS``: each
    token after the first; its alternatives, as many a position)."""
    values = np.asarray(outputs.get(PROMPT_LOGPROBS, ()), np.float64).reshape(-1)
    if len(values) != len(ids) - 1:
        raise RuntimeError(f"the model sent {len(values)} prompt log-probabilities for a prompt of {len(ids)} tokens")
    rows = max(1, len(values))
    alternative_ids = np.asarray(outputs.get(PROMPT_ALTERNATIVE_IDS, ()), np.int64).reshape(rows, -1).tolist()
    alternative_values = np.asarray(outputs.get(PROMPT_ALTERNATIVE_LOGPROBS, ()), np.float64).reshape(rows, -1)
    found = [Token(ids[0], "", math.nan, ids[0] in special)]
    for token, value, top_ids, top_values in zip(ids[1:], values, alternative_ids, alternative_values.tolist()):
        found.append(Token(token, "", float(value), token in special, top=tuple(zip(top_ids, top_values))))
    return found


def collect(generations: list[list[Generation]]) -> list[list[Generation]]:
    """Every generation read to its end; on an error the others are cancelled."""
    try:
        for each in generations:
            for generation in each:
                generation.collect()
    finally:
        for each in generations:
            for generation in each:
                if generation.finish_reason is None:
                    generation.close()
    return generations


def account(timings: dict[str, float] | None, generations: Sequence[Generation], cancelled: bool = False) -> None:
    """A request's generations in its timings (the metrics and the access line): the tokens generated,
    the time to the first token, the tokens per second after it, and a generation the caller left."""
    if timings is None:
        return
    timings[GENERATED_TOKENS] = timings.get(GENERATED_TOKENS, 0) + sum(len(g.tokens) for g in generations)
    firsts = [g.first_token_s for g in generations if g.first_token_s is not None]
    if firsts:
        timings[TIME_TO_FIRST_TOKEN] = min(firsts)
    rates = [g.tokens_per_second for g in generations if g.tokens_per_second is not None]
    if rates:
        timings[TOKENS_PER_SECOND] = sum(rates)
    if cancelled:
        timings[GENERATION_CANCELLED] = timings.get(GENERATION_CANCELLED, 0) + 1


# Seconds to the first token, and tokens per second after it.
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)
TOKEN_BUCKETS = (1.0, 4.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0)
# What the text_generation family's requests are counted and measured by (its Family record's).
COUNTERS = (
    Counter(
        GENERATED_TOKENS,
        "router_generated_tokens",
        "Tokens generated by text2text and text_generation models, by model (its rate: tokens per second).",
    ),
    Counter(TOOL_CALLS, "router_tool_calls", "Tool calls read out of text_generation chat answers, by model."),
    Counter(
        CONSTRAINED,
        "router_constrained_requests",
        "text_generation requests whose answer kept to a grammar (a JSON Schema, a regex, a tool call), by model.",
    ),
    Counter(
        GENERATION_CANCELLED,
        "router_generation_cancelled",
        "Streamed generations whose caller went away before the end (Triton's stream cancelled), by model.",
    ),
)
MEASURES = (
    Measure(GENERATED_TOKENS, "router_generation_tokens", "Tokens generated per request, by model.", TOKEN_BUCKETS),
    Measure(
        TIME_TO_FIRST_TOKEN,
        "router_time_to_first_token_seconds",
        "Seconds from a generation's start to its first token, by model.",
        FIRST_TOKEN_BUCKETS,
    ),
    Measure(
        TOKENS_PER_SECOND,
        "router_generation_tokens_per_second",
        "Tokens per second after the first token, per request, by model.",
        RATE_BUCKETS,
    ),
)
