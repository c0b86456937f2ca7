"""The Flask router against a fake Triton: every error row of the API reference (docs/reference/api.md)
for JSON envelopes; raw bodies with their custom attributes: ``test_raw_bodies.py``."""

from __future__ import annotations

import io
import socket
import time
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from werkzeug.exceptions import ImATeapot

from app.core.errors import InferenceTimeout, InternalError, ModelNotReady, TritonUnavailable
from app.router import create_app
from clients.triton import TritonClient
from scripts.devtools import free_ports
from tests.support import assert_error, b64, solid_image


def invoke(client, modelname="resnet", payload=None, **envelope):
    body = {"modelname": modelname, "payload": payload if payload is not None else {}, **envelope}
    return client.post("/invocations", json=body)


# ---- /ping ----------------------------------------------------------------------------------


def test_ping_healthy(client):
    response = client.get("/ping")
    assert response.status_code == 200
    assert response.get_json() == {
        "status": "healthy",
        "models": {"bert_base": "READY", "resnet": "READY", "yolov5": "READY"},
    }


def test_ping_unhealthy_while_a_model_loads(client, triton):
    triton.states["yolov5"] = "LOADING"
    del triton.states["bert_base"]
    response = client.get("/ping")
    assert response.status_code == 503
    assert response.get_json() == {
        "status": "unhealthy",
        "models": {"bert_base": "UNAVAILABLE", "resnet": "READY", "yolov5": "LOADING"},
    }


def test_ping_unhealthy_when_server_not_ready(client, triton):
    triton.ready = False
    response = client.get("/ping")
    assert response.status_code == 503
    assert response.get_json()["status"] == "unhealthy"


def test_ping_unknown_when_triton_unreachable(client, triton):
    triton.readiness_error = TritonUnavailable("Triton cannot be reached: connection refused")
    response = client.get("/ping")
    assert response.status_code == 503
    assert response.get_json() == {
        "status": "unhealthy",
        "models": {"bert_base": "UNKNOWN", "resnet": "UNKNOWN", "yolov5": "UNKNOWN"},
    }


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "hanging"])
def test_ping_with_real_client_answers_fast(settings, triton, hang):
    """A real gRPC client: nothing listening, or a socket that accepts and never answers."""
    listener = None
    port = free_ports(1)[0]
    if hang:
        listener = socket.socket()
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
    try:
        real = TritonClient(f"127.0.0.1:{port}", timeout_s=30, ping_timeout_s=0.5)
        app = create_app(settings, registry={}, triton=real)
        test_client = app.test_client()
        for _ in range(2):
            started = time.monotonic()
            response = test_client.get("/ping")
            assert time.monotonic() - started < 2.0
            assert response.status_code == 503
            assert response.get_json()["status"] == "unhealthy"
    finally:
        if listener is not None:
            listener.close()


# ---- JSON envelope: the three models --------------------------------------------------------


def test_resnet_single_image(client, triton):
    response = invoke(client, payload={"img": b64(solid_image())})
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert body["modelname"] == "resnet" and body["version"] == "1"
    result = body["result"]
    assert len(result) == 3  # topk default from model.toml
    assert [set(r) for r in result] == [{"label", "index", "score"}] * 3
    assert result[0]["score"] > result[1]["score"] >= result[2]["score"]
    assert result[0]["label"] == f"class {result[0]['index']}"
    # the Triton pipeline: the encoded image goes to the ensemble unread
    assert triton.calls == [("resnet_pipeline", {"image": (1, len(solid_image())), "image_length": (1, 1)}, None)]


def test_list_gives_list_in_order(client):
    colors = [(0, 0, 0), (255, 255, 255), (120, 10, 200)]
    singles = [invoke(client, payload={"img": b64(solid_image(color=c))}).get_json()["result"] for c in colors]
    response = invoke(client, payload={"img": [b64(solid_image(color=c)) for c in colors], "topk": 2})
    assert response.status_code == 200
    listed = response.get_json()["result"]
    assert [r[0]["index"] for r in listed] == [s[0]["index"] for s in singles]
    assert len({r[0]["index"] for r in listed}) == 3
    assert all(len(r) == 2 for r in listed)


def test_long_list_is_split_into_batches(client, triton):
    images = [b64(solid_image(color=(i, i, i))) for i in range(20)]
    response = invoke(client, payload={"img": images})
    assert response.status_code == 200
    assert len(response.get_json()["result"]) == 20
    assert [call[1]["image"][0] for call in triton.calls] == [8, 8, 4]


def test_list_over_limit_is_refused(client, triton):
    response = invoke(client, payload={"img": [b64(solid_image())] * 65})
    assert_error(response, 400, "invalid_input", "payload.img", "65")
    assert triton.calls == []


def test_an_image_that_decodes_only_in_triton_is_named_as_the_caller_sent_it(client, triton):
    """A header that opens but pixels that do not decode: the pipeline's step refuses its row, the
    router answers 400 naming the caller's item, and the model keeps serving."""
    noise = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="JPEG")
    good, broken = buffer.getvalue(), buffer.getvalue()[: len(buffer.getvalue()) // 2]  # cut short: the header reads
    response = invoke(client, payload={"img": [b64(good), b64(broken)]})
    assert_error(response, 400, "invalid_input", "payload.img[1]", "decodable")
    assert triton.calls[-1][0] == "resnet_pipeline"
    assert invoke(client, payload={"img": b64(good)}).status_code == 200


def test_yolov5_detections_in_image_pixels(client):
    # a 1280x640 image letterboxed to 640x320 with 160 px of padding above and below
    response = invoke(client, "yolov5", {"img": b64(solid_image(1280, 640))})
    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()["result"]
    assert (result["width"], result["height"]) == (1280, 640)
    first, second = result["detections"]
    assert first["label"] == "dog" and first["class_id"] == 16
    assert first["score"] == pytest.approx(0.9)
    assert first["box"] == pytest.approx([540.0, 440.0, 740.0, 640.0])  # clipped at the bottom
    assert second["class_id"] == 0 and second["box"][1] == 0.0


def test_yolov5_options(client):
    response = invoke(client, "yolov5", {"img": b64(solid_image()), "conf_threshold": 0.7})
    assert [d["class_id"] for d in response.get_json()["result"]["detections"]] == [16]
    response = invoke(client, "yolov5", {"img": b64(solid_image()), "max_detections": 1, "iou_threshold": 0})
    assert len(response.get_json()["result"]["detections"]) == 1


def test_bert_one_mask_and_two_masks(client, triton):
    response = invoke(client, "bert_base", {"text": "the capital of france is [MASK]."})
    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()["result"]
    assert len(result) == 5 and set(result[0]) == {"score", "token", "token_str", "sequence"}
    assert result[0]["token"] == 1996  # the fake's first candidate is the first token, "the"
    assert result[0]["sequence"] == "the capital of france is the."
    response = invoke(client, "bert_base", {"text": ["[MASK] is [MASK].", "hello [MASK]"], "topk": 2})
    two, one = response.get_json()["result"]
    assert len(two) == 2 and all(len(row) == 2 for row in two)
    # several masks: special tokens stay in `sequence`, as in Hugging Face's pipeline
    assert two[0][0]["sequence"] == "[CLS] [MASK] is [MASK]. [SEP]"
    assert len(one) == 2 and isinstance(one[0], dict)
    assert [call[1]["input_ids"] for call in triton.calls][-1] == (2, 128)


def test_bert_errors(client):
    assert_error(invoke(client, "bert_base", {"text": "no mask here"}), 400, "invalid_input", "payload.text", "[MASK]")
    long_text = "word " * 200 + "[MASK]"
    assert_error(
        invoke(client, "bert_base", {"text": ["a [MASK]", long_text]}), 400, "invalid_input", "payload.text[1]", "128"
    )
    response = invoke(client, "bert_base", {"text": "[MASK] " + "word " * 200})
    assert response.status_code == 200  # only text after the last mask is cut
    assert_error(invoke(client, "bert_base", {"text": 5}), 400, "invalid_input", "payload.text")
    assert_error(invoke(client, "bert_base", {"text": "[MASK]", "topk": 51}), 400, "invalid_input", "payload.topk")


# ---- the error table ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'"text"',
        b'{"modelname": "resnet", "x": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b"\xff\xfe\xfa",
        b"[" * 100000,
    ],
)
def test_invalid_json(client, body):
    response = client.post("/invocations", data=body, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_json")


def test_modelname_errors(client):
    assert_error(client.post("/invocations", json={"payload": {}}), 404, "unknown_model", "bert_base, resnet, yolov5")
    assert_error(invoke(client, "nope"), 404, "unknown_model", "'nope'", "bert_base, resnet, yolov5")
    assert_error(invoke(client, 5), 400, "invalid_input", "modelname")
    assert_error(invoke(client, ["resnet"]), 400, "invalid_input", "modelname")


def test_payload_errors(client, settings):
    assert_error(client.post("/invocations", json={"modelname": "resnet"}), 400, "invalid_input", "payload")
    assert_error(invoke(client, payload=[1]), 400, "invalid_input", "payload")
    assert_error(invoke(client, payload={}), 400, "invalid_input", "payload.img")
    assert_error(invoke(client, payload={"img": 3}), 400, "invalid_input", "payload.img")
    assert_error(invoke(client, payload={"img": []}), 400, "invalid_input", "payload.img")
    assert_error(invoke(client, payload={"img": "%%%not base64"}), 400, "invalid_input", "payload.img", "base64")
    images = [b64(solid_image())] * 2 + [b64(b"garbage bytes")]
    assert_error(
        invoke(client, payload={"img": images}), 400, "invalid_input", "payload.img[2] is not a decodable image"
    )
    big = b64(solid_image(1001, 1000))  # the fixture's limit is 1,000,000 pixels
    assert_error(invoke(client, payload={"img": big}), 400, "invalid_input", "payload.img", "1001x1000")


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"topk": 0}, "payload.topk"),
        ({"topk": 1001}, "payload.topk"),
        ({"topk": "3"}, "payload.topk"),
        ({"topk": 2.5}, "payload.topk"),
        ({"topk": True}, "payload.topk"),
        ({"colour": 1}, "payload.colour"),
    ],
)
def test_option_errors(client, payload, fragment):
    response = invoke(client, payload={"img": b64(solid_image()), **payload})
    assert_error(response, 400, "invalid_input", fragment)


def test_options_at_their_bounds(client):
    assert len(invoke(client, payload={"img": b64(solid_image()), "topk": 1000}).get_json()["result"]) == 1000
    response = invoke(
        client, "yolov5", {"img": b64(solid_image()), "conf_threshold": 0, "iou_threshold": 1, "max_detections": 1000}
    )
    assert response.status_code == 200


def test_version_is_passed_and_echoed(client, triton):
    response = invoke(client, payload={"img": b64(solid_image())}, version="2")
    assert response.get_json()["version"] == "2"
    assert triton.calls[-1][2] == "2"
    assert_error(invoke(client, payload={"img": b64(solid_image())}, version="latest"), 400, "invalid_input", "version")


def test_payload_too_large(client, settings):
    body = b"x" * (settings.max_body_bytes + 1)
    response = client.post("/invocations", data=body, headers={"Content-Type": "application/json"})
    error = assert_error(response, 413, "payload_too_large")
    assert error["message"].startswith("request body is over 6 MiB (6291456 bytes), the limit MAX_BODY_BYTES sets")


def test_the_body_limit_is_the_settings(settings, triton):
    small = create_app(replace(settings, max_body_bytes=1000), triton=triton).test_client()
    response = small.post("/invocations", data=b"x" * 1001, headers={"Content-Type": "application/json"})
    assert "over 0.0009537 MiB (1000 bytes)" in assert_error(response, 413, "payload_too_large")["message"]
    response = small.post("/invocations", data=b"x" * 1000, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_json")


def test_unknown_path_and_wrong_method(client):
    assert assert_error(client.get("/nope"), 404, "not_found")["message"] == "no such path: /nope"
    assert assert_error(client.get("/invocations"), 405, "method_not_allowed")["message"] == (
        "GET is not allowed on /invocations"
    )
    assert_error(client.post("/ping"), 405, "method_not_allowed", "POST", "/ping")


def test_an_http_error_without_a_class_gets_a_code_from_its_name(settings, triton):
    app = create_app(settings, registry={}, triton=triton)

    @app.get("/teapot")
    def teapot():
        raise ImATeapot()

    response = app.test_client().get("/teapot")
    assert_error(response, 418, "i_m_a_teapot")
    assert response.get_json()["error"]["message"] == ImATeapot.description


@pytest.mark.parametrize(
    "error, status, code",
    [
        (ModelNotReady("model 'resnet' is not ready"), 503, "model_not_ready"),
        (TritonUnavailable("Triton cannot be reached"), 503, "triton_unavailable"),
        (InferenceTimeout("model 'resnet' did not answer within 30 s"), 504, "inference_timeout"),
    ],
)
def test_triton_errors(client, triton, error, status, code):
    triton.error = error
    assert_error(invoke(client, payload={"img": b64(solid_image())}), status, code)


def test_bug_is_opaque_500(client, triton, caplog):
    triton.error = RuntimeError("secret detail")
    response = invoke(client, payload={"img": b64(solid_image())})
    error = assert_error(response, 500, "internal_error")
    assert "secret" not in response.get_data(as_text=True)
    error_id = error["message"].rsplit(" ", 1)[-1]
    assert error == InternalError(error_id).body()["error"] and len(error_id) == 32
    assert any(error_id in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_detector_named_with_a_version_sends_its_network_the_geometry_and_options(client, triton):
    """On the Triton pipeline a detector's network answers detections (NMS in its graph): a request
    naming a version of it goes to the network with the router's own letterbox, the image's geometry
    and the options, and answers what the pipeline answers."""
    payload = {"img": b64(solid_image(320, 200)), "conf_threshold": 0.3}
    through_pipeline = invoke(client, "yolov5", payload).get_json()["result"]
    assert triton.calls[-1][0] == "yolov5_pipeline"
    named = invoke(client, "yolov5", payload, version="1").get_json()
    model, shapes, version = triton.calls[-1]
    assert (model, version) == ("yolov5", "1")
    assert shapes["image_size"] == (1, 2) and shapes["letterbox"] == (1, 3) and shapes["max_detections"] == (1, 1)
    assert named["result"] == through_pipeline
