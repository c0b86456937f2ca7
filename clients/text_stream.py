"""A generation's text as its tokens arrive: incremental decoding and stop sequences.

``TextStream.push(ids)`` takes the tokens of one Triton response and answers the text that is
final now; the pieces joined are always the decode of every token so far (``finish`` adds what was
held back), so a streamed answer equals the whole one. Each push decodes every token so far (as
transformers' ``TextStreamer`` does) and answers the new end of that text, holding back:

- text that ends in U+FFFD: a multi-byte character whose bytes have not all come (byte-level BPE,
  SentencePiece's byte fallback);
- text that could be the start of a stop sequence, or of a pattern the decode's clean-up would
  change (``" ."`` becomes ``"."`` once the period comes);
- the text of a run of byte-fallback tokens (``<0x21>``) still open: Hugging Face's ``ByteFallback``
  decoder writes a run's bytes as their characters only when the whole run is valid UTF-8, else a
  U+FFFD for each byte, so a valid ``"!"`` may turn into ``"\ufffd"`` when the next byte comes
  (``byte_tokens``: the ids of those tokens; the run's text waits for the token after it).

A stop sequence is looked for in the decoded text (wherever it falls among the tokens); the first
one found ends the generation, the text cut right after it (``include_stop``: as Hugging Face's TGI
answers) or right before it (as OpenAI's chat completions answer). ``parse_stop`` checks a caller's
stop sequences.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from tokenizers import Tokenizer

from app.core.causal_lm_contract import MAX_STOP_CHARACTERS, MAX_STOP_SEQUENCES
from app.core.errors import InvalidInput

REPLACEMENT = "\ufffd"


BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_fallback_tokens(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids of a tokenizer's byte-fallback tokens (``<0x21>``), where its decoder has Hugging Face's
    ``ByteFallback`` step (Llama, Mistral, Phi-3 style); else none."""
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    if not any(step.get("type") == "ByteFallback" for step in steps):
        return frozenset()
    return frozenset(
        i for token, i in tokenizer.get_vocab(with_added_tokens=False).items() if BYTE_TOKEN.fullmatch(token)
    )


class TextStream:
    """One generation's text (not shared between threads)."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        stops: Sequence[str] = (),
        include_stop: bool = True,
        held: Sequence[str] = (),
        byte_tokens: frozenset[int] = frozenset(),
    ) -> None:
        self.decode = decode
        self.stops = tuple(stops)
        self.include_stop = include_stop
        # prefixes that may not be answered yet: a stop's or a clean-up pattern's start
        self.held = tuple(s for s in (*self.stops, *held) if s)
        self.byte_tokens = byte_tokens
        self.ids: list[int] = []
        self.text = ""  # the decode of every token so far (cut at a stop once one is found)
        self.sent = 0  # characters of it answered
        self.stopped: str | None = None  # the stop sequence that ended the generation

    def push(self, ids: Sequence[int]) -> str:
        """The text that the tokens ``ids`` make final (often "", never taken back)."""
        if self.stopped is not None:
            return ""
        self.ids.extend(int(i) for i in ids)
        self.text = self.decode(self.ids)
        cut = self._stop()
        if cut is not None:
            self.text = self.text[:cut]
            return self._answer(len(self.text))
        return self._answer(self._ready())

    def finish(self) -> str:
        """The text held back, answered at the end of the generation."""
        return self._answer(len(self.text))

    def _answer(self, end: int) -> str:
        piece = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece

    def _stop(self) -> int | None:
        """Where the text ends at the first stop sequence in it, if one is; the search starts where a
        stop could first end past the text already answered (what is before was searched)."""
        found: tuple[int, str] | None = None
        for stop in self.stops:
            start = max(0, self.sent - len(stop) + 1)
            at = self.text.find(stop, start)
            if at >= 0 and (found is None or at < found[0]):
                found = (at, stop)
        if found is None:
            return None
        at, self.stopped = found
        return at + len(self.stopped) if self.include_stop else at

    def _closed(self) -> int:
        """How much of the text no later token can change: all of it, unless it ends in a run of
        byte-fallback tokens, whose text is then the decode of the tokens before the run (when that
        is where the whole decode begins; else nothing more is final yet)."""
        open_run = len(self.ids)
        while open_run and self.ids[open_run - 1] in self.byte_tokens:
            open_run -= 1
        if open_run == len(self.ids):
            return len(self.text)
        before = self.decode(self.ids[:open_run])
        return len(before) if self.text.startswith(before) else self.sent

    def _ready(self) -> int:
        """How much of the text is final: short of a trailing U+FFFD, and of any end of it that
        begins a held sequence."""
        end = min(len(self.text.rstrip(REPLACEMENT)), self._closed())
        hold = 0
        for sequence in self.held:
            for size in range(min(len(sequence) - 1, end), hold, -1):
                if self.text.endswith(sequence[:size], 0, end):
                    hold = size
                    break
        return end - hold


def parse_stop(value: Any, where: str) -> tuple[str, ...]:
    """A stop sequence or a list of them: at most ``MAX_STOP_SEQUENCES``, each a non-empty string of at
    most ``MAX_STOP_CHARACTERS``."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise InvalidInput(f"{where} must be a string or a list of strings")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidInput(f"{where} has {len(stops)} stop sequences, over the limit of {MAX_STOP_SEQUENCES}")
    for index, stop in enumerate(stops):
        at = where if isinstance(value, str) else f"{where}[{index}]"
        if not isinstance(stop, str) or not stop:
            raise InvalidInput(f"{at} must be a non-empty string")
        if len(stop) > MAX_STOP_CHARACTERS:
            raise InvalidInput(f"{at} is {len(stop)} characters, over the limit of {MAX_STOP_CHARACTERS}")
    return tuple(stops)
