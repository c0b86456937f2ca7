"""``decoder.onnx`` (``app.core.causal_lm_contract``) in one ONNX Runtime session, as the step scheduler
runs it (``Graph``: numpy in, numpy out); ``app.triton.causal_lm_beams`` runs the same graph under Hugging
Face's ``generate`` for beam search. Both share the session and take turns on it.

Turns: the step loop and a beam search run from two threads; each ``session.run`` waits for its
turn, first come first served (``Turns``), so a beam search moves one step between two steps of the
running batch instead of holding the loop for its whole length, and the two never run at once (each
run already has the instance's intra-op threads: two at once would only share the same cores).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from app.core.causal_lm_contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    LAST_POSITION,
    LOGITS,
    LOGITS_POSITIONS,
    POSITION_IDS,
    cache_names,
)


class Turns:
    """A lock that is granted in the order it was asked for (Python's ``Lock`` is not: the thread that
    releases it usually takes it again at once, and a beam search waiting beside the step loop would
    wait for the loop to go idle)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._condition.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *_: object) -> None:
        with self._condition:
            self._serving += 1
            self._condition.notify_all()


def open_session(path: Path, threads: int = 0, providers: Sequence[str] = ()):
    """An ONNX Runtime session of ``path`` on ``threads`` intra-op threads (0: ONNX Runtime's
    default), with the first of ``providers`` that this ONNX Runtime has (else the CPU)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    available = ort.get_available_providers()
    chosen = [p for p in providers if p in available] or ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), options, providers=chosen)


class Graph:
    """One step of the model over a batch: token ids, mask, positions and the key/value cache (one
    ``[batch, kv_heads, past, head_dim]`` array per layer and kind, ``cache_names`` order) in; the last
    position's logits (or every new position's: ``every``) and the cache after the step out. The
    cache's shape is read from the graph."""

    def __init__(self, session) -> None:
        self.session = session
        shapes = {tensor.name: tensor.shape for tensor in session.get_inputs()}
        self.layers = sum(1 for name in shapes if name.startswith("past.")) // 2
        self.past_names = cache_names(self.layers, "past")
        _, self.kv_heads, _, self.head_dim = shapes[self.past_names[0]]
        vocabulary = session.get_outputs()[0].shape[-1]
        self.vocabulary = vocabulary if isinstance(vocabulary, int) else None
        self.output_names = [LOGITS, *cache_names(self.layers, "present")]
        self.turns = Turns()

    def empty(self, batch: int) -> list[np.ndarray]:
        """The cache of a prompt's step: no past."""
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return [np.zeros(shape, np.float32) for _ in self.past_names]

    def run(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        cache: Sequence[np.ndarray],
        every: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits ``[batch, vocabulary]`` (the last position's), or ``[batch, new, vocabulary]`` with
        ``every``, and the cache after the step."""
        kept = np.arange(ids.shape[1], dtype=np.int64) if every else np.asarray(LAST_POSITION, np.int64)
        feed = {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: positions, **dict(zip(self.past_names, cache))}
        with self.turns:
            logits, *present = self.session.run(self.output_names, {**feed, LOGITS_POSITIONS: kept})
        return (logits if every else logits[:, -1]), present


def prompt_inputs(prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts of different lengths as one batch, left-padded (as ``generate`` pads a decoder-only
    batch): ids (padding 0), mask, positions (0 under the padding, where they are masked)."""
    longest = max(len(prompt) for prompt in prompts)
    ids = np.zeros((len(prompts), longest), np.int64)
    mask = np.zeros((len(prompts), longest), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = prompt
        mask[row, longest - len(prompt) :] = 1
    return ids, mask, np.clip(mask.cumsum(-1) - 1, 0, None)
