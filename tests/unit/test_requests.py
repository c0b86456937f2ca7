"""Parsing an /invocations request without Flask: envelope, raw bodies, custom attributes, versions,
the answer's media type from Accept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.core.errors import InvalidInput, InvalidJson, NotAcceptable, UnknownModel, UnsupportedMediaType
from app.router.accept import answer_type
from app.router.parsing import (
    JSON_TYPE,
    Request,
    parse_custom_attributes,
    parse_invocation,
    parse_json_object,
    parse_version,
)
from clients.options import Option
from clients.serving import Registry


class Client(SimpleNamespace):
    """The little of a model client that parsing reads."""

    def options_from_attributes(self, attributes, where):
        option = Option("topk", int, 1, 10, default=3)
        return {"topk": option.parse_text(attributes["topk"], f"{where} topk")} if "topk" in attributes else {}


CLIENTS = {
    "bert_base": Client(name="bert_base", input_field="text", content_types=frozenset({"text/plain"})),
    "resnet": Client(name="resnet", input_field="img", content_types=frozenset({"image/jpeg"})),
}


def lookup(name):
    return Registry(CLIENTS).client(name)


def test_envelope():
    call = parse_invocation(Request(b'{"modelname": "resnet", "version": 2, "payload": {"img": "eA=="}}'), lookup)
    assert (call.client.name, call.payload, call.version, call.label) == ("resnet", {"img": "eA=="}, "2", None)


@pytest.mark.parametrize(
    ("body", "error", "fragment"),
    [
        (b'{"modelname": "resnet"}', InvalidInput, "payload is missing"),
        (b'{"modelname": "resnet", "payload": []}', InvalidInput, "payload must be a JSON object"),
        (b'{"modelname": "resnet", "version": "0", "payload": {}}', InvalidInput, "positive integer version"),
        (b'{"modelname": "nope", "payload": {}}', UnknownModel, "'nope'"),
        (b'{"payload": {}}', UnknownModel, "modelname is missing; served models: bert_base, resnet"),
        (b'{"modelname": 5, "payload": {}}', InvalidInput, "modelname must be a string, got int"),
        (b"[1, 2]", InvalidJson, "must be a JSON object, not list"),
        (b'{"a": NaN}', InvalidJson, "NaN is not a JSON number"),
        (b'{"a": "\\ud800"}', InvalidJson, "lone UTF-16 surrogate"),
        (b'{"a": ', InvalidJson, "not valid JSON"),
    ],
)
def test_envelope_errors(body, error, fragment):
    with pytest.raises(error) as raised:
        parse_invocation(Request(body), lookup)
    assert fragment in raised.value.message


def test_parse_json_object_keeps_what_json_allows():
    assert parse_json_object(b'{"a": [1.5, null, "\\u00e9\\ud83d\\ude00"]}') == {"a": [1.5, None, "é😀"]}
    with pytest.raises(InvalidJson, match="nested too deeply"):
        parse_json_object(b"[" * 100000)


def test_the_registry_lists_the_served_models():
    assert Registry(CLIENTS).client("resnet") is CLIENTS["resnet"]
    for name, error, message in [
        (None, UnknownModel, "modelname is missing; served models: bert_base, resnet"),
        ("", UnknownModel, "modelname is missing; served models: bert_base, resnet"),
        ("vgg", UnknownModel, "model 'vgg' is not served; served models: bert_base, resnet"),
        (["resnet"], InvalidInput, "modelname must be a string, got list"),
    ]:
        with pytest.raises(error) as raised:
            Registry(CLIENTS).client(name)
        assert raised.value.message == message


def test_raw_bodies_as_they_reach_the_client():
    image = parse_invocation(Request(b"\x89PNG", "image/jpeg", {}, "modelname=resnet"), lookup)
    assert (image.payload, image.version, image.label) == ({"img": b"\x89PNG"}, None, "the body")
    for params in ({}, {"charset": "utf8"}, {"charset": "UTF-8"}):
        text = parse_invocation(Request("é [MASK]".encode(), "text/plain", params, "modelname=bert_base"), lookup)
        assert text.payload == {"text": "é [MASK]"}


def test_raw_text_with_options_from_the_header():
    request = Request(
        b"Paris is the [MASK].", "text/plain", {"charset": "UTF-8"}, "modelname=bert_base, topk=7, version=3, other"
    )
    call = parse_invocation(request, lookup)
    assert call.payload == {"text": "Paris is the [MASK].", "topk": 7}
    assert (call.version, call.label) == ("3", "the body")


@pytest.mark.parametrize(
    ("request_", "error", "fragment"),
    [
        (
            Request(b"x", "text/plain", {"charset": "latin-1"}, "modelname=bert_base"),
            UnsupportedMediaType,
            "must be UTF-8, not latin-1",
        ),
        (Request(b"\xff", "text/plain", {}, "modelname=bert_base"), InvalidInput, "not valid UTF-8"),
        (Request(b"", "image/jpeg", {}, "modelname=resnet"), InvalidInput, "the body is empty"),
        (Request(b"x", "image/png", {}, "modelname=resnet"), UnsupportedMediaType, "does not take image/png"),
        (Request(b"x", "text/plain", {}, "modelname=bert_base,topk=11"), InvalidInput, "topk must be between"),
        (
            Request(b"x", "text/plain", {}, "modelname=bert_base,version=v2"),
            InvalidInput,
            "X-Amzn-SageMaker-Custom-Attributes version must be a positive integer",
        ),
        (Request(b"x", "image/jpeg", {}, "topk=2"), UnknownModel, "modelname is missing"),
    ],
)
def test_raw_errors(request_, error, fragment):
    with pytest.raises(error) as raised:
        parse_invocation(request_, lookup)
    assert fragment in raised.value.message


def test_custom_attributes_and_versions():
    assert parse_custom_attributes(" a = 1 ,b=2,novalue,=x") == {"a": "1", "b": "2"}
    assert parse_version(None, "v") is None and parse_version(" 12 ", "v") == "12"
    for bad in (True, 0, "01", "1.5", -1):
        with pytest.raises(InvalidInput):
            parse_version(bad, "v")


JSONL, XJSONL = "application/jsonlines", "application/x-jsonlines"


@pytest.mark.parametrize(
    ("body", "accept", "expected"),
    [
        (JSON_TYPE, "", JSON_TYPE),  # no Accept, */* and application/*: the body's own form
        (XJSONL, "", XJSONL),
        (JSON_TYPE, "*/*", JSON_TYPE),
        (XJSONL, "*/*", XJSONL),
        (XJSONL, "application/*", XJSONL),
        (JSON_TYPE, "Application/JSONLines", JSONL),
        (JSON_TYPE, "text/csv, application/jsonlines;q=0.5", JSONL),  # q values
        (JSON_TYPE, "application/json;q=0.2, application/jsonlines", JSONL),
        (XJSONL, "application/jsonlines;q=0.5, */*;q=0.9", XJSONL),  # a wildcard ranked above a type
        (JSON_TYPE, "*/*;q=0.1, application/x-jsonlines", XJSONL),
        (JSON_TYPE, "application/json;q=0, */*", JSONL),  # the most specific range rules its type out
        (JSON_TYPE, "application/json; charset=utf-8", JSON_TYPE),  # parameters other than q not matched
        (JSON_TYPE, "text/*;q=1, application/*;q=0.3", JSON_TYPE),
    ],
)
def test_accept_picks_the_answer(body, accept, expected):
    assert answer_type(Request(b"", mimetype=body, accept=accept)) == expected


@pytest.mark.parametrize("accept", ["text/csv", "application/json;q=0", "text/*", "application/json;q=x", ",", "json"])
def test_an_accept_that_no_answer_meets_is_406(accept):
    with pytest.raises(NotAcceptable, match="cannot be answered"):
        answer_type(Request(b"", accept=accept))
