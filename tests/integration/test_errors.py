"""Every error row of the API reference (docs/reference/api.md) through NGINX: status, code, and a message naming the field.

The table of bad requests also checks that each answer conforms to app/router/openapi.json, that /ping is
still 200 after it and that no gunicorn worker was restarted by it. The 503/504 rows need a Triton
that is loading, hung or gone: they are in test_faults.py.
"""

from __future__ import annotations

import struct
import zlib

import pytest
import requests

from tests.support import assert_conforms, assert_error, b64, noise_image, post

pytestmark = pytest.mark.integration

JPEG = noise_image(64, 48, 0)
TRUNCATED_JPEG = JPEG[: len(JPEG) // 2]
OVER_6_MIB = 6 * 1024 * 1024 + 1


def big_png(width: int, height: int) -> bytes:
    """A valid PNG header for a huge image whose pixel data is tiny (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    row = b"\x00" + b"\x00" * width
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(64)) + compressor.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def json_of_size(size: int) -> bytes:
    """A JSON envelope of exactly ``size`` bytes."""
    head, tail = b'{"modelname": "resnet", "payload": {"img": "', b'"}}'
    return head + b"A" * (size - len(head) - len(tail)) + tail


CASES = [
    # (id, body, content type, custom attributes, status, code, words the message must name)
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
    (
        "missing img",
        {"modelname": "resnet", "payload": {}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    (
        "img wrong type",
        {"modelname": "resnet", "payload": {"img": 5}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    (
        "bad base64",
        {"modelname": "yolov5", "payload": {"img": "%%%not base64%%%"}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    (
        "undecodable image in a list",
        {"modelname": "resnet", "payload": {"img": [b64(JPEG), b64(b"hello")]}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img[1]",),
    ),
    (
        "image over the pixel limit",
        {"modelname": "resnet", "payload": {"img": b64(big_png(8000, 8000))}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img", "pixels"),
    ),
    (
        "text without mask",
        {"modelname": "bert_base", "payload": {"text": "no mask here"}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.text", "[MASK]"),
    ),
    (
        "mask past the sequence limit",
        {"modelname": "bert_base", "payload": {"text": "word " * 200 + "[MASK]"}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.text", "128"),
    ),
    (
        "option out of range",
        {"modelname": "resnet", "payload": {"img": b64(JPEG), "topk": 0}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("topk",),
    ),
    (
        "threshold out of range",
        {"modelname": "yolov5", "payload": {"img": b64(JPEG), "conf_threshold": 1.5}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("conf_threshold",),
    ),
    (
        "unknown option",
        {"modelname": "resnet", "payload": {"img": b64(JPEG), "colour": "red"}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("colour",),
    ),
    ("raw option out of range", JPEG, "image/jpeg", "modelname=resnet,topk=5000", 400, "invalid_input", ("topk",)),
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
    ("undecodable raw image", b"not an image", "image/png", "modelname=yolov5", 400, "invalid_input", ("body",)),
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
    # Missing and mistyped fields.
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
        "img null",
        {"modelname": "resnet", "payload": {"img": None}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    (
        "img empty list",
        {"modelname": "yolov5", "payload": {"img": []}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    (
        "img list of numbers",
        {"modelname": "resnet", "payload": {"img": [1, 2]}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img[0]",),
    ),
    (
        "text a number",
        {"modelname": "bert_base", "payload": {"text": 5}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.text",),
    ),
    (
        "text nested list",
        {"modelname": "bert_base", "payload": {"text": [["a [MASK]"]]}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.text[0]",),
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
    # Images that are not usable.
    (
        "base64 of text",
        {"modelname": "resnet", "payload": {"img": b64(b"just some words, no image")}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    (
        "truncated jpeg",
        {"modelname": "resnet", "payload": {"img": b64(TRUNCATED_JPEG)}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("payload.img",),
    ),
    ("truncated raw jpeg", TRUNCATED_JPEG, "image/jpeg", "modelname=yolov5", 400, "invalid_input", ("body",)),
    (
        "raw decompression bomb",
        big_png(20_000, 20_000),
        "image/png",
        "modelname=yolov5",
        400,
        "invalid_input",
        ("pixels",),
    ),
    ("empty raw body", b"", "image/jpeg", "modelname=resnet", 400, "invalid_input", ("empty",)),
    (
        "list far over the batch limit",
        {"modelname": "resnet", "payload": {"img": [b64(JPEG)] * 1000}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("1000", "64"),
    ),
    (
        "text list far over the limit",
        {"modelname": "bert_base", "payload": {"text": ["a [MASK]"] * 5000}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("5000",),
    ),
    # Text.
    (
        "emoji without mask",
        {"modelname": "bert_base", "payload": {"text": "🙂🙃 naïve café 你好"}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("[MASK]",),
    ),
    (
        "raw emoji without mask",
        "🙂 日本語のテキスト".encode(),
        "text/plain; charset=utf-8",
        "modelname=bert_base",
        400,
        "invalid_input",
        ("[MASK]",),
    ),
    (
        "raw text not utf-8",
        b"\xff\xfe a [MASK]",
        "text/plain; charset=utf-8",
        "modelname=bert_base",
        400,
        "invalid_input",
        ("UTF-8",),
    ),
    (
        "raw text in latin-1",
        b"caf\xe9 [MASK]",
        "text/plain; charset=latin-1",
        "modelname=bert_base",
        415,
        "unsupported_media_type",
        ("UTF-8",),
    ),
    (
        "many masks past the limit",
        {"modelname": "bert_base", "payload": {"text": "[MASK] " * 200}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("128",),
    ),
    (
        "unicode model name",
        {"modelname": "résnet🙂", "payload": {}},
        "application/json",
        None,
        404,
        "unknown_model",
        ("résnet🙂",),
    ),
    # Options out of range or of the wrong type.
    (
        "topk a float",
        {"modelname": "resnet", "payload": {"img": b64(JPEG), "topk": 2.5}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("topk",),
    ),
    (
        "topk a string",
        {"modelname": "resnet", "payload": {"img": b64(JPEG), "topk": "3"}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("topk",),
    ),
    (
        "topk a boolean",
        {"modelname": "resnet", "payload": {"img": b64(JPEG), "topk": True}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("topk",),
    ),
    (
        "topk over 1000",
        {"modelname": "resnet", "payload": {"img": b64(JPEG), "topk": 1001}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("topk",),
    ),
    (
        "bert topk over 50",
        {"modelname": "bert_base", "payload": {"text": "a [MASK]", "topk": 51}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("topk",),
    ),
    (
        "negative iou",
        {"modelname": "yolov5", "payload": {"img": b64(JPEG), "iou_threshold": -0.1}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("iou_threshold",),
    ),
    (
        "max_detections over 1000",
        {"modelname": "yolov5", "payload": {"img": b64(JPEG), "max_detections": 1001}},
        "application/json",
        None,
        400,
        "invalid_input",
        ("max_detections",),
    ),
    (
        "raw threshold not a number",
        JPEG,
        "image/jpeg",
        "modelname=yolov5,conf_threshold=abc",
        400,
        "invalid_input",
        ("conf_threshold",),
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


def workers(stack) -> list[int]:
    return sorted(stack.pids()["router"])


def test_the_table_has_at_least_40_bad_requests():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_error_rows(stack, case):
    _, body, content_type, attributes, status, code, mentions = case
    before = workers(stack)
    r = post(stack, body, content_type, attributes)
    assert_error(r, status, code, *mentions)
    assert_conforms(r, "/invocations", "POST")
    assert stack.ping().status_code == 200
    assert workers(stack) == before, "a gunicorn worker was restarted"


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
