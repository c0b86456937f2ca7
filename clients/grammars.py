"""A request's grammar as the router reads it from each form and checks it before Triton
(``app.core.grammar``): OpenAI's ``response_format`` (``json_object``, ``json_schema``), TGI's
``grammar`` (``{"type": "json", "value": schema}``, ``{"type": "regex", "value": regex}``), the
envelope's ``json_schema``, and a tool call the model must make (``clients.tool_calls``).

A schema is first held to its draft's meta-schema (``jsonschema``), then compiled by llguidance
against the model's own tokenizer, as the Triton model compiles it: what llguidance refuses (a
``pattern`` with look-around, a grammar rule never defined) is a 400 naming the field and
llguidance's reason, and Triton never sees it. The openvino engine follows no grammar: a model on it
refuses one with a 400.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.errors import InvalidInput
from app.core.grammar import JSON_SCHEMA, REGEX, Grammar, GrammarError, check, schema_of, tokenizer
from clients.tool_calls import check_schema

JSON_OBJECT = {"type": "object"}  # OpenAI's json_object: any JSON object
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TGI_GRAMMARS = {"json": JSON_SCHEMA, "json_object": JSON_SCHEMA, "json_schema": JSON_SCHEMA, "regex": REGEX}


def schema_grammar(value: Any, where: str) -> Grammar:
    """A JSON Schema (an object, or its JSON text) as a grammar, held to its meta-schema."""
    try:
        schema = schema_of(value, where)
    except GrammarError as error:
        raise InvalidInput(str(error)) from None
    check_schema(schema, where)
    return Grammar(JSON_SCHEMA, dict(schema))


def response_format(value: Any, where: str = "response_format") -> Grammar | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}``."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise InvalidInput(f"{where}.type must be one of {', '.join(RESPONSE_FORMATS)}")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar(JSON_SCHEMA, dict(JSON_OBJECT))
    described = value.get("json_schema")
    if not isinstance(described, dict) or not isinstance(described.get("name"), str):
        raise InvalidInput(f'{where}.json_schema must be {{"name", "schema", "strict"?}}')
    if "strict" in described and described["strict"] is not None and not isinstance(described["strict"], bool):
        raise InvalidInput(f"{where}.json_schema.strict must be true or false")
    return schema_grammar(described.get("schema", JSON_OBJECT), f"{where}.json_schema.schema")


def tgi_grammar(value: Any, where: str = "parameters.grammar") -> Grammar:
    """TGI's ``grammar``: ``{"type": "json", "value": <schema>}`` or ``{"type": "regex", "value": <regex>}``."""
    kind = TGI_GRAMMARS.get(value.get("type")) if isinstance(value, dict) else None
    if kind is None or "value" not in value:
        raise InvalidInput(f'{where} must be {{"type": "json" or "regex", "value"}}')
    if kind == REGEX:
        if not isinstance(value["value"], str) or not value["value"]:
            raise InvalidInput(f"{where}.value must be a regular expression")
        return Grammar(REGEX, value["value"])
    return schema_grammar(value["value"], f"{where}.value")


class GrammarCheck:
    """A model's check of the grammars it is sent: compiled against its tokenizer (llguidance's view
    of it built at the first grammar, kept), its engine one that follows grammars."""

    def __init__(self, tokenizer_json: str, vocabulary: int, end_ids: Iterable[int], engine: str) -> None:
        self.tokenizer_json = tokenizer_json
        self.vocabulary = vocabulary
        self.end_ids = frozenset(end_ids)
        self.engine = engine
        self.lock = threading.Lock()
        self.compiled = None

    def encoded(self, grammar: Grammar | None, where: str) -> bytes:
        """The grammar's bytes for the model's ``grammar`` tensor (none: no bytes), once it compiles."""
        if grammar is None:
            return b""
        if self.engine != "onnxruntime":
            raise InvalidInput(
                f"{where}: this model's engine ({self.engine}) follows no grammar; a model on the "
                "onnxruntime engine does"
            )
        with self.lock:
            if self.compiled is None:
                self.compiled = tokenizer(self.tokenizer_json, self.vocabulary, self.end_ids)
        try:
            check(grammar, self.compiled)
        except GrammarError as error:
            raise InvalidInput(f"{where}: the grammar cannot be followed: {error}") from None
        return grammar.encoded()


def one_constraint(found: Mapping[str, Grammar | None]) -> tuple[str, Grammar] | None:
    """The one grammar a body asks for (its field and the grammar), None for none; two are a 400."""
    given = [(field, grammar) for field, grammar in found.items() if grammar is not None]
    if len(given) > 1:
        raise InvalidInput(f"{given[0][0]} and {given[1][0]} both constrain the answer: send one")
    return given[0] if given else None
