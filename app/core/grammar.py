"""Constrained generation's grammar, as the router checks it and the Triton model follows it.

A request may constrain its answer, token by token, to a grammar: a JSON Schema (OpenAI's
``response_format``, TGI's ``grammar``, the envelope's ``json_schema``), a regular expression (TGI's
``grammar`` of type ``regex``) or a Lark grammar (a tool call the model must make: ``tool_choice``
``"required"`` or a named function, ``clients.tool_calls``). It travels to the Triton model as
``Grammar.encoded()``: the UTF-8 bytes of ``{"kind", "value"}`` in the ``grammar`` tensor
(``app.core.causal_lm_contract.GRAMMAR``; no bytes: no constraint).

The onnxruntime engine follows it with llguidance (``llguidance``'s ``LLMatcher``: the tokens a
grammar allows next, as a bit mask over the vocabulary, a few microseconds a step); the router
compiles it with the same library against the same tokenizer first, so a grammar that cannot be
followed is a 400 naming what llguidance refused, before Triton sees it. A JSON Schema is followed
with fixed separators, ``", "`` and ``": "`` (Python's ``json.dumps``, no other whitespace): every
answer is one JSON text, and a model cannot fill its tokens with spaces. llguidance is imported at
the first grammar, never by a model asked for none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

JSON_SCHEMA, REGEX, LARK = "json_schema", "regex", "lark"
KINDS = (JSON_SCHEMA, REGEX, LARK)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_BYTES = 256 * 1024  # a schema's, a regex's or a grammar's text, at most


class GrammarError(ValueError):
    """A grammar that cannot be followed; the message is llguidance's (or names the field)."""


@dataclass(frozen=True)
class Grammar:
    """One constraint: its kind (``KINDS``) and its value (a schema object, a regex, a Lark text)."""

    kind: str
    value: Any

    def encoded(self) -> bytes:
        return json.dumps({"kind": self.kind, "value": self.value}, ensure_ascii=False).encode()

    @classmethod
    def decoded(cls, data: bytes) -> Grammar | None:
        """The grammar of the tensor's bytes (None: no bytes); ``GrammarError`` where they are not one."""
        if not data:
            return None
        if len(data) > MAX_GRAMMAR_BYTES:
            raise GrammarError(f"grammar is {len(data)} bytes, over the limit of {MAX_GRAMMAR_BYTES}")
        try:
            document = json.loads(data.decode("utf-8"))
        except ValueError:
            raise GrammarError('grammar must be the UTF-8 JSON {"kind", "value"}') from None
        if not isinstance(document, dict) or document.get("kind") not in KINDS or "value" not in document:
            raise GrammarError(f'grammar must be {{"kind", "value"}}, its kind one of {", ".join(KINDS)}')
        return cls(document["kind"], document["value"])

    def llguidance(self) -> str:
        """The grammar as llguidance takes it (``LLMatcher``'s)."""
        from llguidance import LLMatcher

        if self.kind == JSON_SCHEMA:
            try:
                return LLMatcher.grammar_from_json_schema(self.value, defaults=dict(JSON_OPTIONS))
            except ValueError as error:
                raise GrammarError(f"the JSON Schema cannot be compiled: {error}") from None
        if not isinstance(self.value, str):
            raise GrammarError(f"a {self.kind} grammar's value must be a string")
        return (
            LLMatcher.grammar_from_regex(self.value) if self.kind == REGEX else LLMatcher.grammar_from_lark(self.value)
        )


def tokenizer(tokenizer_json: str, vocabulary: int, end_ids: Iterable[int]):
    """llguidance's view of a model's tokenizer (``tokenizer.json``'s text): its ``vocabulary`` the
    logits' width, its end-of-sequence ids the only tokens a finished grammar allows."""
    from llguidance import LLTokenizer

    return LLTokenizer(tokenizer_json, n_vocab=vocabulary, eos_token=sorted(end_ids) or None)


def check(grammar: Grammar, llg_tokenizer) -> str:
    """``grammar`` compiled against the tokenizer: its llguidance grammar; ``GrammarError`` with
    llguidance's message where it cannot be followed."""
    from llguidance import LLMatcher

    compiled = grammar.llguidance()
    failed, messages = LLMatcher.validate_grammar_with_warnings(compiled, llg_tokenizer)
    if failed:
        raise GrammarError(messages[0].strip() if messages else "the grammar cannot be followed")
    return compiled


def json_object(value: Any) -> dict | None:
    """An object given as itself or as its JSON text; None where it is neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def schema_of(value: Any, where: str) -> Mapping[str, Any]:
    """A JSON Schema given as an object or as its JSON text (TGI's ``value`` may be either)."""
    schema = json_object(value)
    if schema is None:
        raise GrammarError(f"{where} must be a JSON Schema (an object, or its JSON text)")
    return schema
