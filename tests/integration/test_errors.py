"""The error rows of the API reference (docs/reference/api.md) about the request as a whole, through NGINX:
bodies that are not a JSON object, the envelope's model name, payload and version, content types and sizes.

Each answer's status, code and a message naming the field are checked, and also that it conforms to
the OpenAPI description (GET /openapi.json), that /ping is still 200 after it and that no gunicorn
worker was restarted by it.
The rows about one model's payload (its images, texts and options) are in test_payload_errors.py (their
table: tests/payload_error_rows.py); the 503/504 rows need a Triton that is loading, hung or gone: they
are in test_faults.py.
"""

from __future__ import annotations

import pytest
import requests

from tests.payload_error_rows import CASES as PAYLOAD_CASES
from tests.support import assert_error, assert_error_row, b64, noise_image, post

pytestmark = pytest.mark.integration

JPEG = noise_image(64, 48, 0)
OVER_6_MIB = 6 * 1024 * 1024 + 1


def json_of_size(size: int) -> bytes:
    """A JSON envelope of exactly ``size`` bytes."""
    head, tail = b'{"modelname": "resnet", "payload": {"img": "', b'"}}'
    return head + b"A" * (size - len(head) - len(tail)) + tail


CASES = [
    # (id, body, content type, custom attributes, status, code, words the message must name)
    # The envelope: its model name and payload.
    ("not json", b"{not json", "application/json", None, 400, "invalid_json", ()),
    ("json array", [1, 2], "application/json", None, 400, "invalid_json", ("object",)),
    (
        "no modelname",
        {"payload": {"img": b64(JPEG)}},
        "application/json",
        None,
        404,
        "unknown_model",
        ("resnet", "yolov5", "bert_base"),
    ),
    (
        "unknown model",
        {"modelname": "vgg", "payload": {}},
        "application/json",
        None,
        404,
        "unknown_model",
        ("vgg", "resnet", "yolov5", "bert_base"),
    ),
    (
        "modelname not a string",
        {"modelname": 7, "payload": {}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("modelname",),
    ),
    ("missing payload", {"modelname": "resnet"}, "application/json", None, 400, "invalid_input", ("payload",)),
    ("raw without modelname", JPEG, "image/jpeg", "topk=3", 404, "unknown_model", ("resnet",)),
    (
        "image to the text model",
        JPEG,
        "image/jpeg",
        "modelname=bert_base",
        415,
        "unsupported_media_type",
        ("bert_base", "image/jpeg"),
    ),
    (
        "text to an image model",
        b"a [MASK]",
        "text/plain; charset=utf-8",
        "modelname=resnet",
        415,
        "unsupported_media_type",
        ("resnet", "text/plain"),
    ),
    # Bodies that are not a JSON object.
    ("empty json body", b"", "application/json", None, 400, "invalid_json", ()),
    ("json string", b'"resnet"', "application/json", None, 400, "invalid_json", ("object",)),
    ("json null", b"null", "application/json", None, 400, "invalid_json", ("object",)),
    ("json number", b"42", "application/json", None, 400, "invalid_json", ("object",)),
    ("not utf-8", b"\xff\xfe{}", "application/json", None, 400, "invalid_json", ()),
    (
        "NaN",
        b'{"modelname": "resnet", "payload": {"img": "x", "topk": NaN}}',
        "application/json",
        None,
        400,
        "invalid_json",
        ("NaN",),
    ),
    (
        "Infinity",
        b'{"modelname": "yolov5", "payload": {"img": "x", "conf_threshold": Infinity}}',
        "application/json",
        None,
        400,
        "invalid_json",
        ("Infinity",),
    ),
    (
        "-Infinity",
        b'{"modelname": "yolov5", "payload": {"img": "x", "iou_threshold": -Infinity}}',
        "application/json",
        None,
        400,
        "invalid_json",
        ("Infinity",),
    ),
    (
        "deeply nested arrays",
        b"[" * 100_000 + b"]" * 100_000,
        "application/json",
        None,
        400,
        "invalid_json",
        ("nested",),
    ),
    (
        "deeply nested payload",
        b'{"modelname": "resnet", "payload": {"img": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}",
        "application/json",
        None,
        400,
        "invalid_json",
        ("nested",),
    ),
    (
        "lone surrogate",
        b'{"modelname": "bert_base", "payload": {"text": "\\ud800 [MASK]"}}',
        "application/json",
        None,
        400,
        "invalid_json",
        ("surrogate",),
    ),
    (
        "4,400-digit number",
        b'{"modelname": "resnet", "payload": {"topk": ' + b"9" * 4400 + b"}}",
        "application/json",
        None,
        400,
        "invalid_json",
        (),
    ),
    # Missing and mistyped fields of the envelope.
    (
        "payload a string",
        {"modelname": "resnet", "payload": "img"},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload",),
    ),
    (
        "payload a list",
        {"modelname": "resnet", "payload": [b64(JPEG)]},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload",),
    ),
    (
        "modelname a list",
        {"modelname": ["resnet"], "payload": {}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("modelname",),
    ),
    (
        "version a word",
        {"modelname": "resnet", "version": "latest", "payload": {"img": b64(JPEG)}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("version",),
    ),
    (
        "version 0",
        {"modelname": "resnet", "version": 0, "payload": {"img": b64(JPEG)}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("version",),
    ),
    (
        "version not served",
        {"modelname": "resnet", "version": "7", "payload": {"img": b64(JPEG)}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("version",),
    ),
    # A model name no model has.
    (
        "unicode model name",
        {"modelname": "résnet🙂", "payload": {}},
        "application/json",
        None,
        404,
        "unknown_model",
        ("résnet🙂",),
    ),
    # Content types.
    ("image/gif", JPEG, "image/gif", "modelname=resnet", 415, "unsupported_media_type", ("image/gif",)),
    (
        "form body",
        b"img=abc",
        "application/x-www-form-urlencoded",
        "modelname=resnet",
        415,
        "unsupported_media_type",
        ("application/x-www-form-urlencoded",),
    ),
    ("xml body", b"<img/>", "application/xml", "modelname=yolov5", 415, "unsupported_media_type", ("application/xml",)),
    # Too large: NGINX answers, in the same JSON shape.
    (
        "6 MiB + 1 byte raw",
        b"x" * OVER_6_MIB,
        "application/octet-stream",
        "modelname=resnet",
        413,
        "payload_too_large",
        ("6 MiB",),
    ),
    ("6 MiB + 1 byte json", json_of_size(OVER_6_MIB), "application/json", None, 413, "payload_too_large", ("6 MiB",)),
]


def test_the_tables_have_at_least_40_bad_requests():
    assert len(CASES) + len(PAYLOAD_CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_error_rows(stack, case):
    assert_error_row(stack, case)


def test_body_over_6_mib_gets_the_413_json(stack):
    r = post(stack, b"x" * (6 * 1024 * 1024 + 1), "application/octet-stream", "modelname=resnet")
    assert_error(r, 413, "payload_too_large", "6 MiB")
    # Exactly 6 MiB passes NGINX and reaches the router (which finds it is no image).
    r = post(stack, b"x" * (6 * 1024 * 1024), "application/octet-stream", "modelname=resnet")
    assert_error(r, 400, "invalid_input")


def test_unknown_path_is_a_json_404(stack):
    for path in ("/", "/nope", "/invocations/extra", "/v2/models"):
        r = requests.get(f"{stack.url}{path}", timeout=10)
        assert_error(r, 404, "not_found")


def test_get_invocations_is_a_json_405(stack):
    assert_error(requests.get(f"{stack.url}/invocations", timeout=10), 405, "method_not_allowed")
    assert_error(requests.post(f"{stack.url}/ping", timeout=10), 405, "method_not_allowed")


def test_boto3_path_reaches_invocations(stack):
    r = requests.post(
        f"{stack.url}/endpoints/my-endpoint/invocations",
        timeout=60,
        json={"modelname": "resnet", "payload": {"img": b64(JPEG), "topk": 1}},
    )
    assert r.status_code == 200 and len(r.json()["result"]) == 1
