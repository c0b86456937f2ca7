"""The OpenAPI document built from the families (app.router.openapi): a family defined here, with one
option and a result schema of its own, appears in it with nothing else edited; families that share an
option are described honestly; the template's prose names only fields and options some family
takes; schemathesis (make fuzz) loads the document."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

import jsonschema_rs
import numpy as np
import schemathesis

from app.core.family import Family
from app.router.openapi import TEMPLATE_PATH, openapi_document, result_schema_name
from clients.base import ModelClient
from clients.families import FAMILIES
from clients.options import Option


class ToyClient(ModelClient[None]):
    """A family of its own: an audio clip in, its transcript out."""

    family = "toy_speech"
    input_field = "audio"
    content_types = frozenset({"audio/wav"})
    OPTIONS = (Option("loudness", float, 0.5, 2.0, default=1.0),)
    INPUT_SCHEMA: ClassVar[Mapping[str, Any]] = {"type": "string", "format": "byte"}
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "required": ["transcript"],
        "additionalProperties": False,
        "properties": {"transcript": {"type": "string"}},
    }

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], None]:
        raise NotImplementedError

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: None, options: Mapping[str, Any]) -> Any:
        raise NotImplementedError


class LouderToyClient(ToyClient):
    """Another family sharing the toy's option, with another range and default, and a result of its own."""

    family = "toy_louder"
    OPTIONS = (Option("loudness", float, 1.0, 8.0, default=4.0),)
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {"type": "array", "items": {"type": "number"}}


def validator(document: dict, name: str):
    """A validator of ``components.schemas.<name>``, its references resolved within the document."""
    return jsonschema_rs.validator_for({"$ref": f"#/components/schemas/{name}", "components": document["components"]})


def test_a_family_defined_elsewhere_brings_its_option_input_and_result():
    document = openapi_document({ToyClient.family: Family(ToyClient.family, ToyClient)}, max_items=8)
    schemas = document["components"]["schemas"]
    payload = schemas["Payload"]["properties"]
    assert set(payload) == {"audio", "loudness"}  # the template's prose for the real families is left out
    loudness = {k: v for k, v in payload["loudness"].items() if k != "description"}
    assert loudness == {"type": "number", "minimum": 0.5, "maximum": 2.0, "default": 1.0}
    assert payload["loudness"]["description"].startswith("toy_speech: ")
    assert payload["audio"]["oneOf"][1] == {
        "type": "array",
        "minItems": 1,
        "maxItems": 8,
        "items": {"type": "string", "format": "byte"},
    }
    assert schemas["ToySpeechResult"] == ToyClient.RESULT_SCHEMA
    result = schemas["Invocation"]["properties"]["result"]["anyOf"]
    assert {"$ref": "#/components/schemas/ToySpeechResult"} in result
    invocation = validator(document, "Invocation")
    assert invocation.is_valid({"modelname": "toy", "version": "1", "result": {"transcript": "hello"}})
    assert invocation.is_valid(
        {"modelname": "toy", "version": "1", "result": [{"transcript": "a"}, {"transcript": "b"}]}
    )
    assert not invocation.is_valid({"modelname": "toy", "version": "1", "result": {"words": "hello"}})
    envelope = validator(document, "Envelope")
    assert envelope.is_valid({"modelname": "toy", "payload": {"audio": "AAAA", "loudness": 1.5}})
    assert not envelope.is_valid({"modelname": "toy", "payload": {"audio": "AAAA", "loudness": 3}})


def test_a_family_added_to_the_real_ones_keeps_theirs():
    document = openapi_document({**FAMILIES, ToyClient.family: Family(ToyClient.family, ToyClient)})
    payload = document["components"]["schemas"]["Payload"]["properties"]
    assert {"img", "text", "topk", "loudness", "audio"} <= set(payload)
    names = {result_schema_name(family) for family in (*FAMILIES, ToyClient.family)}
    assert names <= set(document["components"]["schemas"])


def test_an_option_two_families_take_differently_has_the_widest_range_and_each_ones_words():
    document = openapi_document({toy.family: Family(toy.family, toy) for toy in (ToyClient, LouderToyClient)})
    loudness = document["components"]["schemas"]["Payload"]["properties"]["loudness"]
    assert (loudness["minimum"], loudness["maximum"]) == (0.5, 8.0)
    assert "default" not in loudness  # the families' defaults differ: each is named instead
    assert "toy_speech: 0.5 to 2, default 1.0" in loudness["description"]
    assert "toy_louder: 1 to 8, default 4.0" in loudness["description"]
    results = document["components"]["schemas"]["Invocation"]["properties"]["result"]["anyOf"]
    assert {"$ref": "#/components/schemas/ToyLouderResult"} in results


def test_the_templates_prose_names_only_what_a_family_takes():
    prose = json.loads(TEMPLATE_PATH.read_text())["components"]["schemas"]["Payload"]["properties"]
    served = openapi_document(FAMILIES)["components"]["schemas"]["Payload"]["properties"]
    assert set(prose) <= set(served), sorted(set(prose) - set(served))
    assert all(set(entry) <= {"description", "enum"} for entry in prose.values())


def test_every_family_declares_its_result():
    for name, family in FAMILIES.items():
        assert family.result and family.result.get("description", "").startswith(name), name


def test_schemathesis_loads_the_document():
    schema = schemathesis.openapi.from_dict(openapi_document(FAMILIES))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in operations} >= {("POST", "/invocations"), ("GET", "/ping")}
