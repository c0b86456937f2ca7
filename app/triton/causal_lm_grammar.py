"""A row's grammar in the onnxruntime engine's step loop (``app.core.grammar``): before the row
chooses its token, every token its grammar does not allow next gets a logit of minus infinity; once
chosen, the token moves the grammar on. Greedy, sampled or penalised, the row chooses among what the
grammar allows, with the same processors (``app.triton.causal_lm_tokens``).

The model's llguidance tokenizer is built at the first grammar (a few milliseconds for a small
vocabulary, about a second for 150,000 tokens) from the folder's ``tokenizer.json``, its end ids the
generation config's: a grammar that is done allows only them, so the row ends. A row whose grammar
allows nothing (llguidance's error state: never with the tokens it allowed) is allowed its end ids,
so it ends with what it made instead of failing the step of every row.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from app.core.grammar import Grammar, GrammarError, tokenizer


class Constraint:
    """One row's grammar, as llguidance follows it."""

    def __init__(self, matcher, vocabulary: int, ends: frozenset[int]) -> None:
        from llguidance.numpy import allocate_token_bitmask

        self.matcher = matcher
        self.ends = sorted(ends)
        self.bits = allocate_token_bitmask(1, vocabulary)

    def mask(self, logits: np.ndarray) -> None:
        """``logits`` (the row's ``[vocabulary]``, in place): minus infinity where not allowed."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, self.bits)
        allowed = np.unpackbits(self.bits[0].view(np.uint8), bitorder="little")[: logits.shape[-1]].astype(bool)
        if self.matcher.is_error() or not allowed.any():
            allowed[:] = False
            allowed[self.ends] = True
        logits[~allowed] = -np.inf

    def chose(self, token: int) -> None:
        self.matcher.consume_token(int(token))


class Grammars:
    """A model's grammars: its llguidance tokenizer (built once, at the first) and a row's constraint."""

    def __init__(self, folder: Path, vocabulary: int, ends: frozenset[int]) -> None:
        self.folder = folder
        self.vocabulary = vocabulary
        self.ends = ends
        self.lock = threading.Lock()
        self.tokenizer = None

    def constraint(self, grammar: Grammar | None) -> Constraint | None:
        """The constraint of a request's grammar (None: none); ``GrammarError`` where it cannot be followed."""
        if grammar is None:
            return None
        from llguidance import LLMatcher

        with self.lock:
            if self.tokenizer is None:
                text = (self.folder / "tokenizer.json").read_text(encoding="utf-8")
                self.tokenizer = tokenizer(text, self.vocabulary, self.ends)
        matcher = LLMatcher(self.tokenizer, grammar.llguidance(), log_level=0)  # compiled once, here
        if matcher.is_error():  # llguidance's constructor never raises: a grammar it refuses is an error state
            raise GrammarError(matcher.get_error().strip())
        return Constraint(matcher, self.vocabulary, self.ends)
