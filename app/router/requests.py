"""What an ``/invocations`` request asks for, parsed without Flask: pure functions over the body,
its media type and the custom-attributes header, which tests call directly.

Two forms (CONTRACT.md): the JSON envelope ``{"modelname", "version"?, "payload"}``, and a raw body
(an image, or UTF-8 text) with the model, version and options in
``X-Amzn-SageMaker-Custom-Attributes``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from app.core.errors import InvalidInput, InvalidJson, UnknownModel, UnsupportedMediaType
from clients.base import ModelClient

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
JSON_TYPE = "application/json"
UTF8_NAMES = frozenset({"utf-8", "utf8"})
VERSION_PATTERN = re.compile(r"[1-9][0-9]{0,18}")
# JSON's \uXXXX escapes can spell a lone UTF-16 surrogate, a string no UTF-8 codec will take.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Request:
    """The parts of an HTTP request that ``/invocations`` reads."""

    body: bytes
    mimetype: str = JSON_TYPE
    mimetype_params: Mapping[str, str] = field(default_factory=dict)
    custom_attributes: str = ""


@dataclass(frozen=True)
class Invocation:
    """A parsed request: the client that serves it, its payload, the version asked for, and how
    error messages name the input (``None``: ``payload.<field>``; a raw body is "the body")."""

    client: ModelClient
    payload: dict[str, Any]
    version: str | None
    label: str | None = None


def _reject_constant(name: str) -> Any:
    raise InvalidJson(f"the body is not valid JSON: {name} is not a JSON number")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; NaN and Infinity, which Python's json accepts, are refused."""
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidJson(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidJson("the body is not usable JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidJson(f"the body must be a JSON object, not {type(value).__name__}")
    if SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):  # the scan only when one is possible
        raise InvalidJson("the body is not usable JSON: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return False


def parse_custom_attributes(header: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"}; pairs without ``=`` are not ours and are ignored."""
    pairs = (part.partition("=") for part in header.split(","))
    return {key.strip(): value.strip() for key, sep, value in pairs if sep and key.strip()}


def parse_version(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not VERSION_PATTERN.fullmatch(value.strip()):
        raise InvalidInput(f"{where} must be a positive integer version such as \"1\", got {value!r}")
    return value.strip()


def raw_item(request: Request) -> bytes | str:
    """A raw body as one input item: bytes for images, text (UTF-8) for ``text/*``."""
    if not request.body:
        raise InvalidInput("the body is empty")
    if not request.mimetype.startswith("text/"):
        return request.body
    charset = (request.mimetype_params.get("charset") or "utf-8").lower()
    if charset not in UTF8_NAMES:
        raise UnsupportedMediaType(f"text bodies must be UTF-8, not {charset}")
    try:
        return request.body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("the body is not valid UTF-8 text") from None


def find_client(registry: Mapping[str, ModelClient], name: Any) -> ModelClient:
    """The client serving ``name`` (the request's ``modelname``, as it came)."""
    if name is None or name == "":
        raise UnknownModel(f"modelname is missing; served models: {', '.join(sorted(registry))}")
    if not isinstance(name, str):
        raise InvalidInput(f"modelname must be a string, got {type(name).__name__}")
    client = registry.get(name)
    if client is None:
        raise UnknownModel(f"model {name!r} is not served; served models: {', '.join(sorted(registry))}")
    return client


def parse_invocation(request: Request, lookup: Callable[[Any], ModelClient]) -> Invocation:
    """The envelope or the raw body -> an Invocation; ``lookup`` finds the model's client (or
    raises UnknownModel / InvalidInput)."""
    if request.mimetype == JSON_TYPE:
        envelope = parse_json_object(request.body)
        client = lookup(envelope.get("modelname"))
        version = parse_version(envelope.get("version"), "version")
        payload = envelope.get("payload")
        if not isinstance(payload, dict):
            raise InvalidInput("payload is missing" if payload is None else "payload must be a JSON object")
        return Invocation(client, payload, version)
    attributes = parse_custom_attributes(request.custom_attributes)
    client = lookup(attributes.get("modelname"))
    if request.mimetype not in client.content_types:
        accepted = ", ".join(sorted({JSON_TYPE, *client.content_types}))
        raise UnsupportedMediaType(f"model {client.name!r} does not take {request.mimetype}; it takes {accepted}")
    version = parse_version(attributes.get("version"), f"{CUSTOM_ATTRIBUTES} version")
    options = client.options_from_attributes(attributes, CUSTOM_ATTRIBUTES)
    return Invocation(client, {client.input_field: raw_item(request), **options}, version, "the body")
