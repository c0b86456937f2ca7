"""The media types a KServe v2 body may come in (JSON, binary+json with its header's size), a binary+json
header that is not JSON, and Triton's refusals mapped to the router's errors (status, code, and what
Triton said)."""

from __future__ import annotations

import pytest

from app.core.errors import InvalidInput, InvalidJson, UnsupportedMediaType
from app.router.parsing import BINARY_JSON_PREFIX, BODY_TYPES, Request, check_media_type, pass_through
from clients.kserve import refusal
from clients.v2_checks import BINARY_JSON_TYPE


def test_media_types():
    with pytest.raises(UnsupportedMediaType) as raised:
        check_media_type(
            Request(b"x", "application/x-foo", content_type="application/x-foo"), frozenset({"image/jpeg"})
        )
    assert raised.value.status == 415
    for taken in ["application/x-foo", "image/jpeg", "application/json", "application/jsonlines", BINARY_JSON_TYPE]:
        assert taken in raised.value.message
    prefixed = Request(
        b"x",
        f"additional-string/{BINARY_JSON_TYPE}",
        {"json-header-size": "10"},
        content_type=f"additional-string/{BINARY_JSON_PREFIX}10",
    )
    with pytest.raises(InvalidInput) as raised:
        check_media_type(prefixed, frozenset())
    assert raised.value.status == 400 and BINARY_JSON_PREFIX in raised.value.message
    for mimetype in BODY_TYPES:
        content_type = f"{BINARY_JSON_PREFIX}10" if mimetype == BINARY_JSON_TYPE else mimetype
        check_media_type(Request(b"x", mimetype, content_type=content_type), frozenset())


def test_binary_json_header_that_is_not_json():
    body = b"{not json" + b"\0" * 8
    request = Request(body, BINARY_JSON_TYPE, {"json-header-size": "9"}, content_type=f"{BINARY_JSON_PREFIX}9")
    with pytest.raises(InvalidJson) as raised:
        pass_through(request, "bert_base")
    assert (raised.value.status, raised.value.code) == (400, "invalid_json") and "JSON header" in raised.value.message
    good = Request(b'{"inputs": []}' + b"\1\2", BINARY_JSON_TYPE, {"json-header-size": "14"})
    passed = pass_through(good, "bert_base")
    assert (passed.model, passed.header, bytes(passed.binary)) == ("bert_base", {"inputs": []}, b"\1\2")


@pytest.mark.parametrize(
    ("status", "message", "answer", "fragment"),
    [
        (
            400,
            "unexpected shape for input 'input_ids'",
            (400, "invalid_input"),
            "unexpected shape for input 'input_ids'",
        ),
        (
            500,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
            (400, "invalid_input"),
            "Shape does not match",
        ),
        (
            500,
            "item 0 refused: {item} is not a decodable image",
            (400, "invalid_input"),
            "item 0 of the batch: it is not a decodable image",
        ),
        (
            500,
            "CUDA error: an illegal memory access was encountered",
            (500, "inference_failed"),
            "illegal memory access",
        ),
        (
            500,
            "Failed to process the request(s) for model instance 'bert_0', message: KeyError: 'label' not found",
            (500, "inference_failed"),
            "KeyError",
        ),
        (503, "Server not ready", (503, "model_not_ready"), "Server not ready"),
        (400, "Request for unknown model: 'bert' is not ready", (503, "model_not_ready"), "is not ready"),
        (400, "Request for unknown model: 'x' is not found", (404, "unknown_model"), "'x' is not found"),
    ],
)
def test_triton_refusals(status, message, answer, fragment):
    error = refusal(status, message, "bert")
    assert (error.status, error.code) == answer and fragment in error.message and "'bert'" in error.message
