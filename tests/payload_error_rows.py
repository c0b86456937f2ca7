"""The error rows of the API reference (docs/reference/api.md) about one model's payload: missing and
mistyped fields, images that are not usable, texts past a limit or in another encoding, options out of
range or of the wrong type; in the JSON envelope and as raw bodies. The table that
integration/test_payload_errors.py sends through NGINX, and integration/test_errors.py counts."""

from __future__ import annotations

import struct
import zlib

from tests.support import b64, noise_image

JPEG = noise_image(64, 48, 0)
TRUNCATED_JPEG = JPEG[: len(JPEG) // 2]


def big_png(width: int, height: int) -> bytes:
    """A valid PNG header for a huge image whose pixel data is tiny (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    row = b"\x00" + b"\x00" * width
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(64)) + compressor.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


CASES = [
    # (id, body, content type, custom attributes, status, code, words the message must name)
    # A few of each kind first, then each kind in turn.
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
    ("undecodable raw image", b"not an image", "image/png", "modelname=yolov5", 400, "invalid_input", ("body",)),
    # Missing and mistyped fields.
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
]
