"""SageMaker's response stream, as its front end wraps a container's streamed answer, for the local stack.

On SageMaker, ``InvokeEndpointWithResponseStream`` (boto3's ``invoke_endpoint_with_response_stream``)
posts to ``/endpoints/<name>/invocations-response-stream``; the front end calls the container's
``/invocations`` and hands the bytes of its chunked answer to the caller as ``PayloadPart`` events of
the AWS event stream encoding (``application/vnd.amazon.eventstream``), cut wherever its reads
ended: a part may end in the middle of a server-sent event, or of a UTF-8 character. The local
stack answers that path the same way (``app.router``), so that boto3's own parser reads a local
stream as it reads SageMaker's, and ``LOCAL_STREAM_PART_BYTES`` cuts the parts smaller, as a test of a
caller's reassembly.

An event-stream message: its total length and its headers' length (uint32, big-endian), the CRC32
of those 8 bytes, the headers (each: name length (uint8), name, type 7 = string, value length
(uint16), value), the payload, the CRC32 of everything before it.
"""

from __future__ import annotations

import binascii
import json
import struct
from collections.abc import Iterable, Iterator

from flask import Response

EVENT_STREAM_TYPE = "application/vnd.amazon.eventstream"
CONTENT_TYPE_HEADER = "X-Amzn-SageMaker-Content-Type"  # the container's own content type
_STRING = 7


def _headers(headers: dict[str, str]) -> bytes:
    encoded = b""
    for name, value in headers.items():
        key, text = name.encode(), value.encode()
        encoded += struct.pack("!B", len(key)) + key + struct.pack("!BH", _STRING, len(text)) + text
    return encoded


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message."""
    head = _headers(headers)
    prelude = struct.pack("!II", 16 + len(head) + len(payload), len(head))
    body = prelude + struct.pack("!I", binascii.crc32(prelude)) + head + payload
    return body + struct.pack("!I", binascii.crc32(body))


def payload_part(data: bytes) -> bytes:
    """A ``PayloadPart`` event carrying ``data``."""
    return message(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"}, data
    )


def model_stream_error(code: str, text: str) -> bytes:
    """A ``ModelStreamError`` event: the stream broke after it began (boto3 raises it as an error)."""
    payload = json.dumps({"ErrorCode": code, "Message": text}).encode()
    return message(
        {":exception-type": "ModelStreamError", ":content-type": "application/json", ":message-type": "exception"},
        payload,
    )


def payload_parts(chunks: Iterable[bytes], part_bytes: int = 0) -> Iterator[bytes]:
    """Each chunk of a container's answer as ``PayloadPart`` events, of at most ``part_bytes`` each
    (0: one event a chunk). An empty chunk sends nothing."""
    for chunk in chunks:
        step = part_bytes if part_bytes > 0 else max(1, len(chunk))
        for start in range(0, len(chunk), step):
            yield payload_part(chunk[start : start + step])


def as_payload_parts(answer: Response, part_bytes: int = 0) -> Response:
    """``answer`` as SageMaker's front end hands it to a streaming caller: a success's body (streamed
    or whole) in ``PayloadPart`` events, its content type in ``X-Amzn-SageMaker-Content-Type``; an
    error as it is (boto3 raises it before any event, as SageMaker's ``ModelError``)."""
    if answer.status_code >= 300:
        return answer
    inner = answer.headers.get("Content-Type", "")
    parts = payload_parts(answer.response, part_bytes)
    wrapped = Response(parts, status=answer.status_code, mimetype=EVENT_STREAM_TYPE)
    wrapped.headers[CONTENT_TYPE_HEADER] = inner
    wrapped.headers["X-Accel-Buffering"] = "no"
    wrapped.call_on_close(answer.close)
    return wrapped
