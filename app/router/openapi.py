"""The contract as OpenAPI 3 (``GET /openapi.json``), built from the model families.

``openapi_template.json`` holds what no family decides: the paths, their parameters, bodies and
answers, the error, envelope, KServe v2 and multi-model schemas. ``openapi_document(families)``
adds what each family declares in its own module:

- ``components.schemas.Payload.properties``: each family's input field and extra fields (one item
  of its ``INPUT_SCHEMA``, or a list of them) and the union of the families' ``OPTIONS``: the
  type, the widest range, the choices as an ``enum``, the default; where families that share an
  option differ in range or default, the description names each one's;
- ``components.schemas.<Family>Result``: the family's ``RESULT_SCHEMA`` (one input's result), and
  ``Invocation.result``: any of them, or a list of one of them (a list input).

The template's ``Payload.properties`` hold prose only (a description a family's table cannot give,
and a narrowing such as ``do_sample``'s ``enum``); what the families give overrides them. A new family
edits no JSON: its options, fields and result appear here from its class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

from app.core.family import Family
from app.core.settings import Settings
from clients.base import ModelClient
from clients.options import Option

TEMPLATE_PATH = Path(__file__).with_name("openapi_template.json")
JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
SCHEMA_REF = "#/components/schemas/"


def result_schema_name(family: str) -> str:
    """``text_classification`` -> ``TextClassificationResult``."""
    return "".join(part[:1].upper() + part[1:] for part in family.split("_")) + "Result"


def option_schema(option: Option) -> dict[str, Any]:
    """One family's option as a JSON schema: its type, range or choices, and default."""
    schema: dict[str, Any] = {"type": JSON_TYPES[option.kind]}
    if option.numeric:
        schema |= {"minimum": option.minimum, "maximum": option.maximum}
    if option.choices:
        schema["enum"] = list(option.choices)
    if option.default is not None:
        schema["default"] = option.default
    return schema


def _facts(option: Option) -> str:
    """An option's range and default in words (a family's, where families differ)."""
    words = []
    if option.numeric:
        words.append(f"{option.minimum:g} to {option.maximum:g}")
    if option.choices:
        words.append(" | ".join(option.choices))
    words.append("no default" if option.default is None else f"default {json.dumps(option.default)}")
    return ", ".join(words)


def merged_option(taken: Sequence[tuple[str, Option]]) -> tuple[dict[str, Any], str]:
    """The schema of an option that one or more families take, and the words for where they differ.

    One type: the widest range, every family's choices (none when a family's come from its model),
    the default when all share it. Types that differ: any of the families' schemas."""
    schemas = [option_schema(option) for _, option in taken]
    differ = len({json.dumps(s, sort_keys=True) for s in schemas}) > 1
    notes = "; ".join(f"{family}: {_facts(option)}" for family, option in taken) if differ else ""
    if len({option.kind for _, option in taken}) > 1:
        unique = {json.dumps(s, sort_keys=True): s for s in schemas}
        return {"anyOf": list(unique.values())}, notes
    options = [option for _, option in taken]
    schema: dict[str, Any] = {"type": schemas[0]["type"]}
    if options[0].numeric:
        schema |= {"minimum": min(o.minimum for o in options), "maximum": max(o.maximum for o in options)}
    if all(o.choices for o in options):
        schema["enum"] = list(dict.fromkeys(choice for o in options for choice in o.choices))
    defaults = {json.dumps(o.default) for o in options}
    if len(defaults) == 1 and options[0].default is not None:
        schema["default"] = options[0].default
    return schema, notes


def one_or_list(item: Mapping[str, Any], max_items: int) -> dict[str, Any]:
    """An input field: one item, or a list of 1 to ``max_items`` of them."""
    return {"oneOf": [dict(item), {"type": "array", "minItems": 1, "maxItems": max_items, "items": dict(item)}]}


def payload_properties(
    families: Mapping[str, type[ModelClient]], prose: Mapping[str, Mapping[str, Any]], max_items: int
) -> dict[str, Any]:
    """Every family's input fields, then its options, each with the families that take it."""
    fields: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    whole = {field for cls in families.values() for field in cls.WHOLE_FIELDS}
    for family, cls in families.items():
        for field in (cls.input_field, *sorted(cls.EXTRA_FIELDS)):
            fields.setdefault(field, []).append((family, cls.FIELD_SCHEMAS.get(field, cls.INPUT_SCHEMA)))
    options: dict[str, list[tuple[str, Option]]] = {}
    for family, cls in families.items():
        for option in cls.OPTIONS:
            options.setdefault(option.name, []).append((family, option))
    properties: dict[str, Any] = {}
    for field, taken in fields.items():
        items = {json.dumps(item, sort_keys=True): item for _, item in taken}
        item = next(iter(items.values())) if len(items) == 1 else {"anyOf": list(items.values())}
        if field in whole:
            properties[field] = _described(dict(item), taken, prose.get(field), "taken whole.")
            continue
        words = "one item, or a list of them."
        properties[field] = _described(one_or_list(item, max_items), taken, prose.get(field), words)
    for name, taken in options.items():
        schema, notes = merged_option(taken)
        properties[name] = _described(schema, taken, prose.get(name), f"{_facts(taken[0][1])}.", notes)
    return properties


def _described(
    schema: dict[str, Any],
    taken: Sequence[tuple[str, Any]],
    prose: Mapping[str, Any] | None,
    words: str,
    notes: str = "",
) -> dict[str, Any]:
    """``schema`` over the template's prose for it, described by the families that take it, then the
    prose (else ``words``, when the families agree) and, where they differ, each one's range and default."""
    prose = prose or {}
    text = prose.get("description") or ("" if notes else words)
    if notes:
        text = f"{text} Per family: {notes}.".lstrip()
    return {**prose, **schema, "description": f"{', '.join(family for family, _ in taken)}: {text}"}


def openapi_document(families: Mapping[str, Family], max_items: int = Settings.max_batch_items) -> dict[str, Any]:
    """The OpenAPI document of a router serving ``families`` (``clients.families.FAMILIES``), whose
    list inputs hold at most ``max_items`` items (``MAX_BATCH_ITEMS``). The template's prose for a
    field or option that no family takes is left out."""
    classes = {name: family.client for name, family in families.items()}
    document = json.loads(TEMPLATE_PATH.read_text())
    schemas = document["components"]["schemas"]
    payload = schemas["Payload"]
    payload["properties"] = payload_properties(classes, payload.get("properties", {}), max_items)
    results = []
    for family, cls in classes.items():
        name = result_schema_name(family)
        schemas[name] = deepcopy(dict(cls.RESULT_SCHEMA))
        ref = {"$ref": SCHEMA_REF + name}
        results += [ref, {"type": "array", "items": ref}]
    result = schemas["Invocation"]["properties"]["result"]
    if results:
        result["anyOf"] = results
    return document
