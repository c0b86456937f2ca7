"""What an ``/invocations`` request asks for, parsed without Flask: pure functions over the body,
its media type and the custom-attributes header, which tests call directly.

Our forms (docs/reference/api.md): the JSON envelope ``{"modelname", "version"?, "payload"}``; a raw body
(an image, or UTF-8 text) with the model, version and options in
``X-Amzn-SageMaker-Custom-Attributes``; and JSON Lines (Batch Transform), one envelope per line.
The ``Accept`` header picks the answer's form (``app.router.accept``). Besides them, a KServe v2 body (v2
JSON without ``modelname``, or SageMaker's binary+json) is passed to Triton as it is (``pass_through``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import (
    ApiError,
    InvalidInput,
    InvalidJson,
    LineError,
    UnsupportedMediaType,
)
from clients.base import ModelClient
from clients.v2_checks import BINARY_JSON_TYPE

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
JSON_HEADER_SIZE = "json-header-size"
# How Triton's SageMaker front end recognises a binary+json body: the Content-Type starts with this.
BINARY_JSON_PREFIX = f"{BINARY_JSON_TYPE};{JSON_HEADER_SIZE}="
JSON_TYPE = "application/json"
JSONLINES_TYPE = "application/jsonlines"
JSONLINES_TYPES = frozenset({JSONLINES_TYPE, "application/x-jsonlines"})
# What every model's invocation takes, besides the raw bodies of its family (``ModelClient.content_types``).
BODY_TYPES = frozenset({JSON_TYPE, *JSONLINES_TYPES, BINARY_JSON_TYPE})
ANSWER_TYPES = (JSON_TYPE, *sorted(JSONLINES_TYPES))
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
    accept: str = ""
    target_model: str = ""
    content_type: str = ""  # the header as it came (``mimetype`` is its media type, lower-cased)


@dataclass(frozen=True)
class Served:
    """Who answers an invocation: ``lookup`` gives the client a parsed request names, ``content_types``
    are the raw-body types those clients take; a KServe v2 body goes to ``v2_model`` (when given,
    else to the model the request names), whose configuration is kept per ``load``; ``only``: the one
    model every body goes to (a loaded one's ``/models/<name>/invoke``), which answers a TGI or OpenAI
    body that names none."""

    lookup: Callable[[Any], ModelClient]
    content_types: frozenset[str]
    v2_model: str = ""
    load: object = None
    only: str = ""


def check_media_type(request: Request, content_types: frozenset[str]) -> None:
    """A body none of the route's forms takes is a 415 listing those it takes, before it is read as
    anything; binary+json's type is recognised as Triton's SageMaker front end does (at the start)."""
    position = request.content_type.find(BINARY_JSON_PREFIX)
    if position > 0:
        raise InvalidInput(
            f"Content-Type must start with {BINARY_JSON_PREFIX}N for a binary+json body "
            f"(N: the size of its JSON header), got {request.content_type!r}"[:400]
        )
    taken = BODY_TYPES | content_types
    if request.mimetype not in taken:
        raise UnsupportedMediaType(
            f"Content-Type {request.mimetype} is not taken here; the bodies taken are {', '.join(sorted(taken))}"
        )


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
        raise InvalidInput(f'{where} must be a positive integer version such as "1", got {value!r}')
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


def parse_invocation(
    request: Request, lookup: Callable[[Any], ModelClient], document: Mapping[str, Any] | None = None
) -> Invocation:
    """The envelope or the raw body -> an Invocation; ``lookup`` finds the model's client (or
    raises UnknownModel / InvalidInput). ``document``: a JSON body already parsed."""
    if request.mimetype == JSON_TYPE:
        return parse_envelope(parse_json_object(request.body) if document is None else document, lookup)
    attributes = parse_custom_attributes(request.custom_attributes)
    client = lookup(attributes.get("modelname"))
    if request.mimetype not in client.content_types:
        accepted = ", ".join(sorted({JSON_TYPE, *JSONLINES_TYPES, *client.content_types}))
        raise UnsupportedMediaType(f"model {client.name!r} does not take {request.mimetype}; it takes {accepted}")
    version = parse_version(attributes.get("version"), f"{CUSTOM_ATTRIBUTES} version")
    options = client.options_from_attributes(attributes, CUSTOM_ATTRIBUTES)
    return Invocation(client, {client.input_field: raw_item(request), **options}, version, "the body")


def is_jsonlines(request: Request) -> bool:
    return request.mimetype in JSONLINES_TYPES


def parse_envelope(envelope: Mapping[str, Any], lookup: Callable[[Any], ModelClient]) -> Invocation:
    """One JSON envelope (a whole body, or a line of JSON Lines), parsed -> its Invocation."""
    client = lookup(envelope.get("modelname"))
    version = parse_version(envelope.get("version"), "version")
    payload = envelope.get("payload")
    if not isinstance(payload, dict):
        raise InvalidInput("payload is missing" if payload is None else "payload must be a JSON object")
    return Invocation(client, payload, version)


def body_lines(body: bytes) -> list[bytes]:
    """A JSON Lines body's lines ("\n" or "\r\n" ends each; the last one may go without)."""
    if not body.strip():
        raise InvalidInput("the body holds no lines; JSON Lines is one envelope per line")
    lines = body.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def parse_lines(request: Request, lookup: Callable[[Any], ModelClient]) -> list[Invocation]:
    """Every line of a JSON Lines body as an Invocation; the first bad line is a ``LineError``."""
    invocations = []
    for number, line in enumerate(body_lines(request.body), start=1):
        try:
            if not line.strip():
                raise InvalidInput("the line is empty; each line must be one JSON envelope")
            invocations.append(parse_envelope(parse_json_object(line), lookup))
        except ApiError as error:
            raise LineError(number, error) from None
    return invocations


@dataclass(frozen=True)
class PassThrough:
    """A KServe v2 request for Triton: the model it names, the body as it came, the size of the
    body's JSON header when binary tensors follow it, that header parsed, and what follows it."""

    model: str
    body: bytes
    header: Any
    json_size: int | None = None

    @property
    def binary(self) -> memoryview | None:
        return None if self.json_size is None else memoryview(self.body)[self.json_size :]


def is_v2(document: Mapping[str, Any]) -> bool:
    """A v2 inference request, recognised by its shape: ``inputs`` (checked later) and no ``modelname``;
    not TGI's body, whose ``inputs`` is a string (v2's is a list of tensors)."""
    return "inputs" in document and "modelname" not in document and not isinstance(document["inputs"], str)


def pass_through(request: Request, default_model: str, document: Any = None) -> PassThrough:
    """A v2 body's target: ``X-Amzn-SageMaker-Target-Model`` (a multi-model endpoint's
    ``<name>.tar.gz`` names ``<name>``), the custom attribute ``modelname``, or the default model.
    ``document``: a v2 JSON body already parsed."""
    model = request.target_model.strip().removesuffix(".tar.gz")
    model = model or parse_custom_attributes(request.custom_attributes).get("modelname", "") or default_model
    if not model:
        raise InvalidInput(
            f"a KServe v2 body names no model: send {TARGET_MODEL}, the custom attribute modelname=..., "
            "or start the endpoint with SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
        )
    if request.mimetype != BINARY_JSON_TYPE:
        return PassThrough(model, request.body, parse_json_object(request.body) if document is None else document)
    raw = request.mimetype_params.get(JSON_HEADER_SIZE, "")
    if not raw.isdigit() or int(raw) > len(request.body):
        raise InvalidInput(
            f"{BINARY_JSON_TYPE} needs ;{JSON_HEADER_SIZE}=N, the size of the JSON header at the start of the "
            f"body (at most the body's {len(request.body)} bytes), got {raw or 'none'}"
        )
    size = int(raw)
    try:
        header = parse_json_object(request.body[:size])
    except InvalidJson as error:
        raise InvalidJson(
            f"the JSON header of the {BINARY_JSON_TYPE} body (its first {size} bytes, "
            f"{JSON_HEADER_SIZE}) is not a JSON object: {error.message}"
        ) from None
    return PassThrough(model, request.body, header, size)
