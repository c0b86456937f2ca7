"""Tokenizing plain ASCII text without the normalizer steps that change nothing in it.

BERT's normalizer (``BertNormalizer``: BERT, DistilBERT, MiniLM, ELECTRA... and ``bert_base``'s vocab.txt)
cleans control characters, puts spaces around CJK characters, strips accents (NFD) and lowercases. On
text made only of printable ASCII characters, tabs and line breaks, the first three do nothing but turn
a tab or a line break into a space: what is left is ``Replace`` and ``Lowercase``, which keep every
character where it was. The tokenizers library still runs each step over the text, keeping track of
every character's alignment, and that is a quarter of a 496-token text's tokenizing (1.22 -> 0.92 ms).

``Encoder`` keeps the tokenizer and that twin, and tokenizes plain text with the twin: the same ids,
offsets, type ids and special tokens (``tests/unit/test_plain_text.py`` checks it, added tokens
included). Any other text, and any tokenizer whose normalizer is not BERT's, takes the tokenizer itself.
"""

from __future__ import annotations

import re

from tokenizers import Encoding, Tokenizer, normalizers

# What may be in a plain text: printable ASCII, tabs and line breaks (BertNormalizer's whitespace besides " ")
NOT_PLAIN = re.compile(r"[^\x20-\x7e\t\n\r]")
BREAKS = ("\t", "\n", "\r")  # BertNormalizer's clean_text makes each a space


def is_plain(text: str) -> bool:
    """Printable ASCII, tabs and line breaks only (``isprintable`` first: a C loop, and most texts are)."""
    return text.isascii() and (text.isprintable() or NOT_PLAIN.search(text) is None)


def plain_twin(tokenizer: Tokenizer) -> Tokenizer | None:
    """A copy of the tokenizer with its ``BertNormalizer`` replaced by what it does to plain text; None
    where the normalizer is another (nothing known to skip)."""
    normalizer = tokenizer.normalizer
    if not isinstance(normalizer, normalizers.BertNormalizer):
        return None
    steps: list[normalizers.Normalizer] = []
    if normalizer.clean_text:
        steps += [normalizers.Replace(character, " ") for character in BREAKS]
    if normalizer.lowercase:
        steps.append(normalizers.Lowercase())
    twin = Tokenizer.from_str(tokenizer.to_str())
    twin.normalizer = normalizers.Sequence(steps) if steps else None
    return twin


class Encoder:
    """A tokenizer's ``encode``, through its plain-text twin where the text (and its pair) allow it."""

    def __init__(self, tokenizer: Tokenizer, twin: bool = True) -> None:
        """``twin=False``: the tokenizer alone (a twin of bert-base-uncased's holds 6 MiB: a rare path
        does without one)."""
        self.tokenizer = tokenizer
        self.twin = plain_twin(tokenizer) if twin else None

    def pick(self, text: str, pair: str | None = None) -> Tokenizer:
        if self.twin is not None and is_plain(text) and (pair is None or is_plain(pair)):
            return self.twin
        return self.tokenizer

    def encode(self, text: str, pair: str | None = None, offsets: bool = True) -> Encoding:
        """The text's encoding; without ``offsets`` (all (0, 0)) the tokenizer skips tracking them."""
        tokenizer = self.pick(text, pair)
        if offsets:
            return tokenizer.encode(text, pair)
        return tokenizer.encode_batch_fast([text if pair is None else (text, pair)])[0]
