"""What the text_generation scheduler's tests share: a sink that keeps what it is sent, requests with
the contract's defaults, random prompts, ``generate``'s answer for a prompt alone, and a scheduler turned
until its requests end (the tests: ``tests/unit/test_causal_lm_scheduler*.py``)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from app.core.causal_lm_contract import ARCHITECTURES, BUSY_MARKER, SETTINGS
from app.triton.causal_lm_requests import Busy, Request
from app.triton.causal_lm_scheduler import Scheduler

KINDS = ARCHITECTURES
WAIT_S = 60


class Collect:
    """A sink that keeps what it is sent; ``cancel_after``: it says cancelled once it has that many tokens."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.lasts: list[bool] = []
        self.alternatives: list = []
        self.prompt_logprobs = None  # (log-probabilities, (alternative ids, values)), where asked
        self.error: Exception | None = None
        self.done = threading.Event()
        self.cancel_after = cancel_after

    def token(self, token_id, logprob, last, alternatives=None):
        assert not self.done.is_set(), "a token after the stream's end"
        self.alternatives.append(alternatives)
        self.tokens.append(token_id)
        self.logprobs.append(logprob)
        self.lasts.append(last)
        if last:
            self.done.set()

    def prompt(self, logprobs, alternatives):
        assert not self.tokens and self.prompt_logprobs is None, "the prompt's log-probabilities come once, first"
        self.prompt_logprobs = (logprobs, alternatives)

    def sequence(self, token_ids, logprobs):
        assert not self.done.is_set()
        self.tokens, self.logprobs = list(token_ids), list(logprobs)
        self.done.set()

    def failed(self, error):
        assert not self.done.is_set()
        self.error = error
        self.done.set()

    def cancelled(self):
        return self.cancel_after is not None and len(self.tokens) >= self.cancel_after


def request(prompt, sink=None, deadline=float("inf"), grammar=None, **settings) -> Request:
    given = {s.name: s.default for s in SETTINGS} | settings
    return Request(np.asarray(prompt, np.int64), given, deadline, sink or Collect(), grammar)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    generator = np.random.default_rng(seed)
    return [generator.integers(3, 256, size=int(generator.integers(1, 16))).tolist() for _ in range(count)]


def generate(model, prompt, scores: bool = False, **settings):
    """``generate``'s new tokens for ``prompt`` alone (and its processed scores, with ``scores``)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        found = model.generate(
            ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True, output_scores=True, **settings
        )
    tokens = found.sequences[0, len(prompt) :].tolist()
    return (tokens, torch.cat(found.scores)) if scores else tokens


def scheduler(causal_lms, graphs, kind="llama", **options) -> Scheduler:
    return Scheduler(causal_lms(kind)[0], graphs[kind], **options)


def turns_until_done(scheduler: Scheduler, sinks, clock=None, most: int = 200) -> None:
    for _ in range(most):
        if all(sink.done.is_set() for sink in sinks):
            return
        scheduler.turn(block=False)
        if clock is not None:
            clock[0] += 1
    raise AssertionError("the requests did not end")


def drawn(make, prompt, seed: int, settings: dict, others=()) -> Collect:
    """The sink of ``prompt`` sampled with ``seed`` and ``settings`` on a fresh scheduler (``make()``),
    beside ``others`` ((prompt, settings) each), every request turned to its end."""
    steps = make()
    sinks = [Collect() for _ in range(1 + len(others))]
    steps.submit(request(prompt, sinks[0], seed=seed, **settings))
    for (other, extra), sink in zip(others, sinks[1:]):
        steps.submit(request(other, sink, **extra))
    turns_until_done(steps, sinks)
    return sinks[0]


def check_the_waiting_bound(steps, model, clock: list[float]) -> None:
    """``steps`` (either engine, ``max_rows`` 1, ``max_waiting`` 1, on ``clock``): a request beyond the
    one that may wait is refused at once (``Busy``, counted), one is taken again once the first has
    started, the second starts only once the first has ended (one row), the requests taken get
    ``generate``'s tokens, and each one's wait is told as it starts."""
    waits: list[float] = []
    steps.waited = waits.append
    first, second = Collect(), Collect()
    steps.submit(request([5, 6, 7], first, max_new_tokens=4))
    with pytest.raises(Busy, match=BUSY_MARKER):
        steps.submit(request([9], Collect()))
    clock[0] = 2.0
    steps.turn(block=False)  # the first one starts: the queue has room again
    assert waits == [2.0]
    steps.submit(request([8, 9], second, max_new_tokens=4))
    with pytest.raises(Busy, match="1 requests wait"):
        steps.submit(request([9], Collect()))
    turns_until_done(steps, [first, second], clock)  # a turn a second: the second waits for the only row
    assert waits[0] == 2.0 and waits[1] >= 1.0 and steps.counts["busy"] == 2 and steps.counts["finished"] == 2
    for prompt, sink in (([5, 6, 7], first), ([8, 9], second)):
        assert sink.error is None and sink.tokens == generate(model, prompt, max_new_tokens=4, do_sample=False)


def ending_at_a_new_token(causal_lms, tmp_path: Path, prompt: list[int]) -> tuple[object, int, list[int]]:
    """``tmp_path`` made a copy of the tiny Llama's folder (its config files) whose end-of-sequence ids
    are a token that greedy generation from ``prompt`` first makes at its third token or later: (the
    model, that token, the 12 tokens greedy generation makes without it ending)."""
    folder, model = causal_lms("llama")
    free = generate(model, prompt, max_new_tokens=12, do_sample=False, eos_token_id=None)
    end = next(token for i, token in enumerate(free) if i >= 2 and token not in free[:i])  # ends it at i + 1
    for name in ("config.json", "generation_config.json"):
        shutil.copy(folder / name, tmp_path / name)
    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps(config | {"eos_token_id": [end, 2]}))
    return model, end, free
