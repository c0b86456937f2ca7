"""Tokenizing plain ASCII text without the normalizer steps that change nothing in it.

BERT's normalizer (``BertNormalizer``: BERT, DistilBERT, MiniLM, ELECTRA... and ``bert_base``'s vocab.txt)
cleans control characters, puts spaces around CJK characters, strips accents (NFD) and lowercases. On
text made only of printable ASCII characters, tabs and line breaks, the first three do nothing but turn
a tab or a line break into a space: what is left is ``Replace`` and ``Lowercase``, which keep every
character where it was. The tokenizers library still runs each step over the text, keeping track of
every character's alignment.

``Encoder`` keeps the tokenizer and two copies of it, and tokenizes plain text with a copy:

- the *bare* twin has no normalizer at all: the text is given to it lowered in Python (``str.lower``, a
  C loop) where the tokenizer lowercases, its tabs and line breaks left as they are (the pre-tokenizer
  splits words at them as at a space, and only an added token could hold a space), unless it holds a
  character that an added token starts with (the ``[`` of ``[MASK]``), as either case: an added token
  that is not normalized is matched on the text before the normalizer, which lowering the text first
  would change;
- the *twin* has the two steps as its normalizer, for plain text that holds such a character.

Both give the tokenizer's own ids, offsets, type ids and special tokens (``tests/unit/test_plain_text.py``
checks it, added tokens included). Any other text, and any tokenizer whose normalizer is not BERT's,
takes the tokenizer itself. A 496-token text: 0.69 ms through the twin, 0.62 through the bare twin.

The character offsets cost most of what is left: the tokenizers library converts each token's byte
offsets to character ones through a map of the whole text that it builds per text (the same text
without offsets: 0.46 ms). Where the tokenizer is a WordPiece after ``BertPreTokenizer`` and the bare
twin took the text, ``Spans`` rebuilds the offsets from the ids instead (``Encoder.encode_spans``).
"""

from __future__ import annotations

import functools
import re
import string

import numpy as np
from tokenizers import Encoding, Tokenizer, models, normalizers, pre_tokenizers

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


def added_starts(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    """A pattern of the characters that an added token starts with, in either case; None: it has none."""
    firsts = {token.content[:1] for token in tokenizer.get_added_tokens_decoder().values()} - {""}
    either = {case for first in firsts for case in (first, first.lower(), first.upper())}
    return re.compile("[" + "".join(map(re.escape, sorted(either))) + "]") if either else None


def id_tokens(tokenizer: Tokenizer) -> tuple[str | None, ...]:
    """Every id's token, added tokens included (None where no token has the id): a vocabulary of 30k
    reads in about 40 ms, so a client reads it once (``Encoder.id_tokens``)."""
    size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    return tuple(tokenizer.id_to_token(i) for i in range(size))


class Spans:
    """The character offsets of a WordPiece tokenizer's tokens after ``BertPreTokenizer``, rebuilt from
    their ids and the text, for a plain text with no added token in it (what the bare twin takes).

    ``BertPreTokenizer`` cuts such a text into words: runs of letters and digits, and each other
    printable character alone (all of them are ASCII punctuation), whitespace between. WordPiece cuts each
    word into a first piece and continuations (``##`` and the rest of the piece), or makes it one unknown
    token. So a token that is not a continuation starts the next word, and each piece's characters follow
    the one before: a token's offsets are its word's start plus the lengths of the pieces before it. The
    rebuilt offsets are checked against the words (as many first pieces as words, each word's last piece
    ending where the word ends); a text that fails gives None."""

    def __init__(self, tokens: tuple[str | None, ...], prefix: str, unk_id: int | None, head: int, tail: int) -> None:
        """``tokens``: the tokenizer's ``id_tokens``, kept (``Encoder.id_tokens``)."""
        self.tokens = tokens
        texts = [t or "" for t in tokens]
        # a continuation is the prefix and a piece of a word (letters and digits): a first piece never
        # starts with the prefix, which is punctuation (Spans.of), a word of its own
        continuing = np.array([t.startswith(prefix) and t[len(prefix) :].isalnum() for t in texts], bool)
        self.first = ~continuing
        self.lengths = np.array([len(t) for t in texts], np.int64) - len(prefix) * continuing
        self.unk_id = -1 if unk_id is None else unk_id
        self.head, self.tail = head, tail  # the special tokens before and after a text's tokens
        # bytes.translate tables: a text's bytes to 1 where a letter or digit, or punctuation, else 0
        self.alnum = bytes(chr(i) in string.ascii_letters + string.digits for i in range(256))
        self.punctuation = bytes(chr(i) in string.punctuation for i in range(256))

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Spans | None:
        model = tokenizer.model
        if not isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer) or not isinstance(
            model, models.WordPiece
        ):
            return None
        prefix = model.continuing_subword_prefix
        if not prefix or any(c not in string.punctuation for c in prefix):
            return None
        # where the special tokens of one text go: all before or after its tokens ([CLS] ... [SEP]), or none
        mask = tokenizer.encode_batch_fast(["a"])[0].special_tokens_mask
        if mask.count(0) != 1:
            return None
        head = mask.index(0)
        return cls(id_tokens(tokenizer), prefix, tokenizer.token_to_id(model.unk_token), head, len(mask) - head - 1)

    def __call__(self, text: str, ids: np.ndarray) -> np.ndarray | None:
        """[tokens, 2] offsets of one text's tokens ``ids`` (special tokens (0, 0)), as the tokenizer gives
        them; None where the ids are not the text's words as above."""
        codes = text.encode("ascii")
        alnum = np.frombuffer(codes.translate(self.alnum), bool)
        starts = np.frombuffer(codes.translate(self.punctuation), bool).copy()  # a word's first characters
        ends = starts.copy()  # and its last ones
        if codes:
            starts[0] |= alnum[0]
            starts[1:] |= alnum[1:] > alnum[:-1]
            ends[-1] |= alnum[-1]
            ends[:-1] |= alnum[:-1] > alnum[1:]
        starts, ends = np.flatnonzero(starts), np.flatnonzero(ends) + 1
        offsets = np.zeros((len(ids), 2), np.int64)
        token_ids = ids[self.head : len(ids) - self.tail]
        if not len(token_ids):
            return offsets if not len(starts) else None
        first = self.first[token_ids]
        word = np.cumsum(first) - 1
        if not first[0] or word[-1] + 1 != len(starts):
            return None
        lengths = self.lengths[token_ids]
        unknown = token_ids == self.unk_id
        if unknown.any():
            lengths[unknown] = (ends - starts)[word[unknown]]  # the unknown token stands for its whole word
        before = np.cumsum(lengths) - lengths  # the characters of the text's pieces before each
        begin = (starts - before[first])[word] + before
        end = begin + lengths
        if not np.array_equal(end[np.append(first[1:], True)], ends):
            return None
        tokens = offsets[self.head : len(ids) - self.tail]
        tokens[:, 0] = begin
        tokens[:, 1] = end
        return offsets


class Plain:
    """What plain text goes through: the bare twin (and what a text is given to it as), the twin, and
    ``Spans`` where asked for and the tokenizer allows it. A copy of a tokenizer holds as much as the
    tokenizer (6 MiB for a vocabulary of 30k): without ``bare`` (a family whose every text holds an added
    token, the mask) there is no bare twin; with it, the twin is built on the first text that needs it
    (most texts never hold an added token's character)."""

    def __init__(self, tokenizer: Tokenizer, spans: bool, bare: bool) -> None:
        normalizer = tokenizer.normalizer
        self.tokenizer = tokenizer
        self.lowercase = normalizer.lowercase
        self.added = added_starts(tokenizer)
        self.bare: Tokenizer | None = None
        if bare:
            self.bare = Tokenizer.from_str(tokenizer.to_str())
            self.bare.normalizer = None
        else:
            self.twin  # noqa: B018 (built now: it takes every text)
        self.spans = Spans.of(self.bare) if spans and self.bare is not None else None

    @classmethod
    def of(cls, tokenizer: Tokenizer, spans: bool = False, bare: bool = True) -> Plain | None:
        """None where the tokenizer's normalizer is not BERT's."""
        if not isinstance(tokenizer.normalizer, normalizers.BertNormalizer):
            return None
        return cls(tokenizer, spans, bare)

    @functools.cached_property
    def twin(self) -> Tokenizer:
        return plain_twin(self.tokenizer)

    def bare_text(self, text: str) -> str | None:
        """The text as the bare twin takes it; None where it may hold an added token (or there is no bare
        twin)."""
        if self.bare is None or self.added is not None and self.added.search(text) is not None:
            return None
        return text.lower() if self.lowercase else text


class Encoder:
    """A tokenizer's ``encode``, through its plain-text twins where the text (and its pair) allow it."""

    def __init__(self, tokenizer: Tokenizer, twin: bool = True, spans: bool = False, bare: bool = True) -> None:
        """``twin=False``: the tokenizer alone (a rare path does without copies); ``spans``: ``encode_spans``
        rebuilds offsets where it can; ``bare=False``: no bare twin (``Plain``)."""
        self.tokenizer = tokenizer
        self.plain = Plain.of(tokenizer, spans, bare) if twin else None

    @functools.cached_property
    def id_tokens(self) -> tuple[str | None, ...]:
        """The tokenizer's ``id_tokens``: those ``Spans`` read, or read now."""
        spans = self.plain.spans if self.plain is not None else None
        return spans.tokens if spans is not None else id_tokens(self.tokenizer)

    def pick(self, text: str, pair: str | None = None) -> tuple[Tokenizer, str, str | None]:
        """The tokenizer the text (and its pair) go through, and the text and pair as it takes them."""
        plain = self.plain
        if plain is None or not is_plain(text) or (pair is not None and not is_plain(pair)):
            return self.tokenizer, text, pair
        bare_text = plain.bare_text(text)
        bare_pair = None if pair is None else plain.bare_text(pair)
        if bare_text is None or (pair is not None and bare_pair is None):
            return plain.twin, text, pair
        return plain.bare, bare_text, bare_pair

    def encode(self, text: str, pair: str | None = None, offsets: bool = True) -> Encoding:
        """The text's encoding; without ``offsets`` (all (0, 0)) the tokenizer skips tracking them."""
        tokenizer, text, pair = self.pick(text, pair)
        if offsets:
            return tokenizer.encode(text, pair)
        return tokenizer.encode_batch_fast([text if pair is None else (text, pair)])[0]

    def encode_spans(self, text: str) -> tuple[Encoding, str | None]:
        """One text's encoding, and the text as ``spans`` reads it where ``Spans`` can rebuild its tokens'
        offsets (the encoding's own are then (0, 0)); elsewhere the encoding with its offsets, and None."""
        tokenizer, taken, _ = self.pick(text)
        if self.plain is not None and self.plain.spans is not None and tokenizer is self.plain.bare:
            return tokenizer.encode_batch_fast([taken])[0], taken
        return tokenizer.encode(taken), None

    def spans(self, taken: str, ids: np.ndarray) -> np.ndarray | None:
        """The [tokens, 2] character offsets of the tokens ``ids`` of a text ``encode_spans`` took (``taken``:
        what it returned); None where they cannot be rebuilt after all."""
        return self.plain.spans(taken, ids)
