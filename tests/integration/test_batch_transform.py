"""Batch Transform's question and asynchronous inference's limits, through the real stack's port:
GET /execution-parameters, and a body over the real-time limit answered when the limit is raised."""

from __future__ import annotations

import io
import json
import math

import pytest
import requests
from PIL import Image

from app.core.settings import BODY_LIMIT, CONCURRENT_TRANSFORMS, SERVER_TIMEOUT
from tests.references import darknet_photos
from tests.support import assert_conforms, assert_error, b64, post

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
ASYNC_ENV = {BODY_LIMIT: str(64 * MIB), SERVER_TIMEOUT: "600", CONCURRENT_TRANSFORMS: "1"}


def big_image_body(size: int) -> tuple[bytes, int]:
    """A JSON envelope for yolov5 of at least ``size`` bytes: a list of one large photo repeated."""
    photo = Image.open(io.BytesIO(darknet_photos()["dog.jpg"])).convert("RGB").resize((2400, 1800))
    buffer = io.BytesIO()
    photo.save(buffer, format="JPEG", quality=97)
    encoded = b64(buffer.getvalue())
    count = math.ceil(size / (len(encoded) + 3))
    body = json.dumps({"modelname": "yolov5", "payload": {"img": [encoded] * count}}).encode()
    return body, count


def test_execution_parameters_answer_the_defaults(stack):
    r = requests.get(f"{stack.url}/execution-parameters", timeout=10)
    assert r.status_code == 200
    assert_conforms(r, "/execution-parameters", "GET")
    parameters = r.json()
    assert parameters["BatchStrategy"] == "MULTI_RECORD"
    assert parameters["MaxPayloadInMB"] == 6  # the real-time body limit
    assert 1 <= parameters["MaxConcurrentTransforms"] <= 100 // 6


def test_async_limits_take_a_40_mib_list_of_images_the_defaults_refuse(stack, small_repository, new_stack):
    body, count = big_image_body(40 * MIB)
    assert 40 * MIB <= len(body) < 41 * MIB and count <= 64
    print(f"body {len(body) / MIB:.1f} MiB: a list of {count} JPEGs")

    refused = post(stack, body)
    assert_error(refused, 413, "payload_too_large", "6 MiB", BODY_LIMIT)

    raised = new_stack(small_repository, **ASYNC_ENV)
    raised.wait_healthy()
    parameters = requests.get(f"{raised.url}/execution-parameters", timeout=10).json()
    assert parameters == {"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 64}
    answered = requests.post(
        f"{raised.url}/invocations", data=body, headers={"Content-Type": "application/json"}, timeout=600
    )
    assert answered.status_code == 200, answered.text[:300]
    result = answered.json()["result"]
    assert len(result) == count and all(r["width"] == 2400 and r["height"] == 1800 for r in result)
    assert result[0] == result[-1]  # the same photo: the same detections wherever it sits in the list
    over = post(raised, b"x" * (64 * MIB + 1), "application/octet-stream", "modelname=yolov5")
    assert_error(over, 413, "payload_too_large", "64 MiB")
