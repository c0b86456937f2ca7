"""Incremental decoding and stop sequences (``clients.text_stream``) against the whole decode: the
pieces a generation answers token by token, joined, are the decode of all its tokens, for a byte-level
BPE and a SentencePiece-style BPE with byte fallback, on text with multi-byte characters."""

from __future__ import annotations

import pytest

from clients.text import SPACES_BEFORE, clean_up_tokenization
from clients.text_stream import REPLACEMENT, TextStream, byte_fallback_tokens
from scripts.model_prep.small_models.causal import SENTENCES, tokenizer_of

TOKENIZERS = {
    "byte_level": tokenizer_of("qwen2").backend_tokenizer,
    "byte_fallback": tokenizer_of("llama").backend_tokenizer,
}


def decoder(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def streamed(stream: TextStream, ids: list[int]) -> list[str]:
    pieces = [stream.push([token]) for token in ids]
    return [*pieces, stream.finish()]


@pytest.mark.parametrize("kind", TOKENIZERS)
@pytest.mark.parametrize("line", SENTENCES)
def test_pieces_join_to_the_whole_decode(kind, line):
    tokenizer = TOKENIZERS[kind]
    ids = tokenizer.encode(line).ids
    stream = TextStream(decoder(tokenizer))
    pieces = streamed(stream, ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == line
    assert not any(REPLACEMENT in piece for piece in pieces)  # a character is never split


def test_byte_tokens_are_held_until_their_character_is_whole():
    tokenizer = TOKENIZERS["byte_fallback"]
    ids = tokenizer.encode("ok 🚢").ids
    assert sum(tokenizer.id_to_token(i).startswith("<0x") for i in ids) >= 3  # the ship as four byte tokens
    stream = TextStream(decoder(tokenizer))
    pieces = [stream.push([token]) for token in ids]
    assert "".join(pieces) == "ok 🚢" and pieces[-2] == ""


def test_a_run_of_byte_tokens_waits_until_it_closes():
    """What a random model writes: "!" as a byte token, then bytes that make the run invalid UTF-8,
    which the ByteFallback decoder writes as one U+FFFD a byte, the "!" among them."""
    tokenizer = TOKENIZERS["byte_fallback"]
    byte = {value: tokenizer.token_to_id(f"<0x{value:02X}>") for value in (0x21, 0xFA, 0xCC)}
    ids = [*tokenizer.encode("ok").ids, byte[0x21], byte[0xFA], byte[0xCC], *tokenizer.encode("ok").ids]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    assert "!" not in whole  # the run, invalid, is three U+FFFD
    assert "".join(streamed(TextStream(decoder(tokenizer)), ids)) != whole  # what a decode of all so far gives
    tokens = byte_fallback_tokens(tokenizer)
    assert len(tokens) == 256 and not byte_fallback_tokens(TOKENIZERS["byte_level"])
    assert "".join(streamed(TextStream(decoder(tokenizer), byte_tokens=tokens), ids)) == whole


@pytest.mark.parametrize("include_stop", [True, False])
def test_stop_sequence_split_across_tokens(include_stop):
    tokenizer = TOKENIZERS["byte_level"]
    line = SENTENCES[-2]  # "Tokyo is the capital of 日本 and Kyoto was its capital before."
    ids = tokenizer.encode(line).ids
    stop = "Kyoto"  # more than one token here
    assert not any(stop in tokenizer.decode([i]) for i in ids)
    stream = TextStream(decoder(tokenizer), [stop, "never"], include_stop=include_stop)
    pieces = []
    for token in ids:
        pieces.append(stream.push([token]))
        if stream.stopped:
            break
    pieces.append(stream.finish())
    cut = line.index(stop) + (len(stop) if include_stop else 0)
    assert "".join(pieces) == stream.text == line[:cut]
    assert stream.stopped == stop
    assert len(stream.ids) < len(ids)  # the generation ended at the stop


def test_text_that_may_begin_a_stop_is_held_back():
    stream = TextStream(lambda ids: "".join(map(chr, ids)), ["END"], include_stop=False)
    assert stream.push([ord("a")]) == "a"
    assert stream.push([ord("E")]) == ""  # could be END
    assert stream.push([ord("N")]) == ""
    assert stream.push([ord("d")]) == "ENd"  # it was not
    assert stream.push([ord("E"), ord("N"), ord("D"), ord("x")]) == ""
    assert stream.text == "aENd" and stream.stopped == "END"


def test_stop_inside_one_token_and_the_earliest_wins():
    stream = TextStream(lambda ids: ["", "one. two; three"][len(ids)], [";", "."], include_stop=True)
    assert stream.push([7]) == "one."
    assert stream.push([8]) == ""


def test_clean_up_is_applied_only_when_the_next_character_is_known():
    words = ["Hello", " ", ".", " world", " ", "n't", "!"]

    def decode(ids):
        return clean_up_tokenization("".join(words[i] for i in ids))

    stream = TextStream(decode, held=[written for written, _ in SPACES_BEFORE])
    pieces = streamed(stream, list(range(len(words))))
    assert "".join(pieces) == decode(list(range(len(words)))) == "Hello. worldn't!"
