"""A generation request as the ``text_generation`` scheduler takes it, the check of its values, and
the ways it can end other than with its last token (``app.core.causal_lm_contract``).

A request carries its own ``Sink``: where its tokens go as they are chosen. The Triton model's sink
sends each one as a response of the request's stream; the tests' sinks collect them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.core.causal_lm_contract import (
    BUSY_MARKER,
    LOGIT_BIAS,
    MAX_BIASED_TOKENS,
    MAX_LOGIT_BIAS,
    MAX_STOP_TOKEN_IDS,
    SETTINGS,
    STOP_TOKEN_IDS,
    WAITING_PARAMETER,
)
from app.core.generation_contract import DEADLINE_MARKER


class Counts(dict):
    """How the requests ended (and how many steps ran), by name; ``observe(name, added)`` is told of
    each increase (the Triton model's metrics)."""

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__(dict.fromkeys(names, 0))
        self.observe: Callable[[str, int], None] | None = None

    def __setitem__(self, name: str, value: int) -> None:
        added = value - self.get(name, 0)
        super().__setitem__(name, value)
        if self.observe is not None and added:
            self.observe(name, added)


class Refused(ValueError):
    """A request whose values cannot be generated from (the caller's fault: a 400); names the field."""


class Late(RuntimeError):
    """A request that passed its deadline (its message carries ``DEADLINE_MARKER``)."""

    def __init__(self, made: int) -> None:
        super().__init__(f"{DEADLINE_MARKER} after {made} new tokens")


class Cancelled(RuntimeError):
    """A request its caller cancelled: its row is dropped at the next step."""


class Closed(RuntimeError):
    """A request still running or waiting when the model is unloaded."""


class Busy(RuntimeError):
    """A request refused on arrival: as many wait already as the model lets wait (the caller retries)."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{BUSY_MARKER}: {waiting} requests wait for a row ({WAITING_PARAMETER}); retry")


class Sink(Protocol):
    """Where a request's answer goes (a token's ``alternatives``: the likeliest tokens' ids and
    log-probabilities, where asked). Each request gets exactly one ending: a ``token`` with ``last``,
    a ``sequence`` (beam search: every token at once), or ``failed``."""

    def token(self, token_id: int, logprob: float, last: bool, alternatives: Any = None) -> None: ...

    def sequence(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None: ...

    def failed(self, error: Exception) -> None: ...

    def cancelled(self) -> bool: ...


class PromptSink(Sink, Protocol):
    """A sink that asked for its prompt's log-probabilities (``prompt_logprobs`` 0 or more): told them
    once, before the first token (``alternatives``: ids and values ``[tokens - 1, k]``)."""

    def prompt(self, logprobs: np.ndarray, alternatives: tuple[np.ndarray, np.ndarray]) -> None: ...


@dataclass(frozen=True)
class Request:
    """One prompt: its token ids, every setting of ``SETTINGS`` by name, its deadline
    (``time.monotonic()``), its sink, its grammar (``app.core.grammar``; None: none), and what
    ``Loop.submit`` sets: when the scheduler took it and the grammar's constraint (the onnxruntime
    engine's: ``causal_lm_grammar``)."""

    ids: np.ndarray
    settings: Mapping[str, Any]
    deadline: float
    sink: Sink
    grammar: Any = None
    arrived: float = 0.0
    constraint: Any = None


def check(ids: np.ndarray, settings: Mapping[str, Any], vocabulary: int, context: int | None) -> None:
    """What Triton's config cannot say of a request's values: one axis of at least one token id within
    the vocabulary, each setting within its bounds (top_k at most the vocabulary), and the prompt with
    its ``max_new_tokens`` within the model's positions (``context``, None: no bound)."""
    if ids.ndim != 1 or len(ids) == 0:
        raise Refused(f"input_ids must be a prompt of at least one token id, not an array of shape {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocabulary:
        raise Refused(f"input_ids must be token ids from 0 to {vocabulary - 1}")
    for setting in SETTINGS:
        value = settings[setting.name]
        high = vocabulary if setting.name == "top_k" else setting.high
        if setting.dtype == "BOOL":
            if not isinstance(value, (bool, np.bool_)):
                raise Refused(f"{setting.name} must be true or false, not {value!r}")
        elif not (setting.low is None or value >= setting.low) or not (high is None or value <= high):
            raise Refused(f"{setting.name} must be from {setting.low:g} to {high:g}, not {value:g}")
    check_token_lists(settings, vocabulary)
    wanted = len(ids) + int(settings["max_new_tokens"])
    if context is not None and wanted > context:
        raise Refused(
            f"max_new_tokens: the prompt's {len(ids)} tokens and {settings['max_new_tokens']} new ones exceed "
            f"the model's {context} positions"
        )


def check_token_lists(settings: Mapping[str, Any], vocabulary: int) -> None:
    """A request's ``logit_bias`` (pairs of an id and a value) and ``stop_token_ids``: ids within the
    vocabulary, values within OpenAI's bounds, no more than their bounds."""
    bias = settings.get(LOGIT_BIAS, ())
    stops = settings.get(STOP_TOKEN_IDS, ())
    if len(bias) > MAX_BIASED_TOKENS or len(stops) > MAX_STOP_TOKEN_IDS:
        raise Refused(f"{LOGIT_BIAS} takes at most {MAX_BIASED_TOKENS} tokens, {STOP_TOKEN_IDS} {MAX_STOP_TOKEN_IDS}")
    for name, ids in ((LOGIT_BIAS, [token for token, _ in bias]), (STOP_TOKEN_IDS, stops)):
        if any(not 0 <= token < vocabulary for token in ids):
            raise Refused(f"{name}: token ids are from 0 to {vocabulary - 1}")
    if any(not abs(value) <= MAX_LOGIT_BIAS for _, value in bias):
        raise Refused(f"{LOGIT_BIAS}: each value is from -{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}")
