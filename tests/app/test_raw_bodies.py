"""Raw bodies to the Flask router against a fake Triton: an image or a text with the model and its options
in SageMaker's custom attributes, and the errors of the API reference (docs/reference/api.md) that are
theirs (an option refused, a media type the model does not take, no model named, an image that does not
decode)."""

from __future__ import annotations

from tests.support import ATTRIBUTES, assert_error, solid_image


def test_raw_image_with_custom_attributes(client, triton):
    response = client.post(
        "/invocations",
        data=solid_image(fmt="JPEG"),
        headers={"Content-Type": "image/jpeg", ATTRIBUTES: "trace=abc, modelname=resnet,topk=2,flag"},
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(response.get_json()["result"]) == 2
    response = client.post(
        "/invocations",
        data=solid_image(),
        headers={"Content-Type": "application/octet-stream", ATTRIBUTES: "modelname=yolov5,conf_threshold=0.7"},
    )
    assert len(response.get_json()["result"]["detections"]) == 1


def test_raw_text(client):
    response = client.post(
        "/invocations",
        data=b"paris is the [MASK] of france.",
        headers={"Content-Type": "text/plain; charset=utf-8", ATTRIBUTES: "modelname=bert_base,topk=3"},
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(response.get_json()["result"]) == 3


def test_raw_option_errors(client):
    headers = {"Content-Type": "image/png", ATTRIBUTES: "modelname=yolov5,conf_threshold=abc"}
    assert_error(
        client.post("/invocations", data=solid_image(), headers=headers), 400, "invalid_input", "conf_threshold"
    )
    headers[ATTRIBUTES] = "modelname=yolov5,conf_threshold=1.5"
    assert_error(
        client.post("/invocations", data=solid_image(), headers=headers),
        400,
        "invalid_input",
        "conf_threshold",
        "between 0 and 1",
    )


def test_raw_wrong_content_type_is_415(client):
    response = client.post(
        "/invocations", data=solid_image(), headers={"Content-Type": "image/png", ATTRIBUTES: "modelname=bert_base"}
    )
    assert_error(response, 415, "unsupported_media_type", "bert_base", "image/png")
    response = client.post(
        "/invocations", data=b"[MASK]", headers={"Content-Type": "text/plain", ATTRIBUTES: "modelname=resnet"}
    )
    assert_error(response, 415, "unsupported_media_type", "resnet")
    response = client.post(
        "/invocations", data=b"<x/>", headers={"Content-Type": "application/xml", ATTRIBUTES: "modelname=resnet"}
    )
    assert_error(response, 415, "unsupported_media_type")


def test_raw_without_modelname_is_404(client):
    response = client.post("/invocations", data=solid_image(), headers={"Content-Type": "image/png"})
    assert_error(response, 404, "unknown_model", "bert_base, resnet, yolov5")


def test_raw_undecodable_image(client):
    response = client.post(
        "/invocations", data=b"not an image", headers={"Content-Type": "image/jpeg", ATTRIBUTES: "modelname=resnet"}
    )
    assert_error(response, 400, "invalid_input", "the body is not a decodable image")
