"""Grounding DINO's text, as ``GroundingDinoProcessor`` treats it: a list of labels joined into one
prompt, and a box's phrase read from the prompt's tokens (pure functions).

- ``prompt``: ``_merge_candidate_labels_text``: each label stripped and lower-cased, joined by ". ",
  a "." at the end: ``["A cat", "a remote control"]`` -> ``"a cat. a remote control."``. A label that
  holds a "." is refused (the processor would not join such a list, and then fails on it).
- ``phrase_tokens``: ``get_phrases_from_posmap(probs > text_threshold, input_ids)``: the prompt's tokens
  whose probability passes ``text_threshold``, the first column (``[CLS]``) and the last (of 256)
  never; the caller decodes them as the tokenizer's ``batch_decode`` does (special tokens kept: a
  phrase may hold "." or "[SEP]", as the processor's does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.core.errors import InvalidInput

SEPARATOR = "."


def prompt(labels: Sequence[str], where: str) -> str:
    """The processor's prompt of a list of labels."""
    for index, label in enumerate(labels):
        if SEPARATOR in label:
            raise InvalidInput(
                f"{where}[{index}] holds a '.', which separates Grounding DINO's labels: give the prompt as "
                'text ("a cat. a remote control.") instead'
            )
    return ". ".join(label.strip().lower() for label in labels) + SEPARATOR


def phrase_tokens(probs: np.ndarray, input_ids: Sequence[int], text_threshold: float) -> list[int]:
    """One box's phrase: the ids of the tokens above ``text_threshold`` (probs: its 256 columns)."""
    chosen = probs > np.float32(text_threshold)
    chosen[0] = False
    chosen[len(chosen) - 1 :] = False
    return [int(input_ids[i]) for i in np.flatnonzero(chosen)]
