"""GET /openapi.json against the families: the served Payload is the union of the families' option
tables (type, range, default, choices) and input fields, and every served model's answer, for one
input and for a list, is its family's result schema in the served document."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest

from app.router.openapi import openapi_document, result_schema_name
from clients.families import FAMILIES
from tests.support import b64, solid_image

JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


@pytest.fixture
def served(client) -> dict:
    r = client.get("/openapi.json")
    assert r.status_code == 200 and r.mimetype == "application/json"
    return r.get_json()


def test_the_served_document_is_the_one_built_from_the_families(served, settings):
    assert served == json.loads(json.dumps(openapi_document(FAMILIES, settings.max_batch_items)))
    text = served["components"]["schemas"]["Payload"]["properties"]["text"]
    assert text["oneOf"][1]["maxItems"] == settings.max_batch_items


def test_the_payload_is_the_union_of_the_families_options_and_fields(served):
    payload = served["components"]["schemas"]["Payload"]["properties"]
    classes = {name: family.client for name, family in FAMILIES.items()}
    fields = {field for cls in classes.values() for field in (cls.input_field, *cls.EXTRA_FIELDS)}
    taken: dict[str, list] = {}
    for family, cls in classes.items():
        for option in cls.OPTIONS:
            taken.setdefault(option.name, []).append((family, option))
    assert set(payload) == fields | set(taken)
    whole = {field for cls in classes.values() for field in cls.WHOLE_FIELDS}
    for field in fields - whole:  # one item or a list of them
        assert payload[field]["oneOf"][1]["type"] == "array", field
    for field in whole:  # a JSON Schema the answer follows
        assert "oneOf" not in payload[field] and payload[field]["type"] in ("object", "array"), field
    for name, each in taken.items():
        schema, options = payload[name], [option for _, option in each]
        assert schema["type"] == JSON_TYPES[options[0].kind], name
        assert all(family in schema["description"].split(":")[0] for family, _ in each), name
        if options[0].numeric:
            assert schema["minimum"] == min(o.minimum for o in options), name
            assert schema["maximum"] == max(o.maximum for o in options), name
        if options[0].kind is str:
            choices = [c for o in options for c in o.choices] if all(o.choices for o in options) else None
            assert schema.get("enum") == (list(dict.fromkeys(choices)) if choices else None), name
        defaults = {json.dumps(o.default) for o in options}
        if len(defaults) == 1:
            assert schema.get("default") == options[0].default, name
        else:  # each family's default in words
            assert "default" not in schema, name
            for family, option in each:
                assert f"{family}: " in schema["description"] and json.dumps(option.default) in schema["description"]
        if "enum" in schema and options[0].default is not None:
            assert options[0].default in schema["enum"], name


def result_validator(document: dict, family: str):
    ref = {"$ref": f"#/components/schemas/{result_schema_name(family)}"}
    return jsonschema_rs.validator_for({**ref, "components": document["components"]})


@pytest.mark.parametrize(
    "model, family, payload",
    [
        ("resnet", "image_classification", {"img": b64(solid_image()), "topk": 2}),
        ("yolov5", "detection", {"img": b64(solid_image(width=96, height=64))}),
        ("bert_base", "fill_mask", {"text": "paris is the [MASK] of france."}),
        ("bert_base", "fill_mask", {"text": "[MASK] is the [MASK] of france."}),
    ],
)
def test_each_answer_is_its_familys_result(client, served, model, family, payload):
    answers = []
    for body in (payload, {**payload, **{k: [v, v] for k, v in payload.items() if k in ("img", "text")}}):
        r = client.post("/invocations", json={"modelname": model, "payload": body})
        assert r.status_code == 200, r.get_data(as_text=True)
        answers.append(r.get_json())
    single, listed = answers
    check = result_validator(served, family)
    assert not [e.message for e in check.iter_errors(single["result"])]
    assert all(check.is_valid(result) for result in listed["result"])
    invocation = jsonschema_rs.validator_for(
        {"$ref": "#/components/schemas/Invocation", "components": served["components"]}
    )
    assert invocation.is_valid(single) and invocation.is_valid(listed)
    other = next(f for f in FAMILIES if f != family and f in ("image_classification", "detection"))
    assert not result_validator(served, other).is_valid(single["result"])
