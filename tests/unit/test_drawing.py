"""invoke --draw: a detector's boxes drawn where the answer puts them, a classifier's top-k written, a
segmenter's masks laid translucent one colour a prompt; read back from the PNG file, pixel by pixel."""

from __future__ import annotations

import io
import json

import boto3
import numpy as np
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from PIL import Image

from scripts.caller import invoke
from scripts.caller.drawing import PALETTE, NotDrawable, draw_answer, line_width, save

GREY = (128, 128, 128)


def photo(width=400, height=300, orientation=None) -> bytes:
    image = Image.new("RGB", (width, height), GREY)
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    image.save(buffer, format="JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue()


DETECTOR_ANSWER = {
    "width": 400,
    "height": 300,
    "detections": [
        {"label": "dog", "class_id": 16, "score": 0.91, "box": [60.2, 120.4, 250.7, 280.0]},
        {"label": "person", "class_id": 0, "score": 0.55, "box": [300.0, 40.0, 380.0, 200.0]},
    ],
}


def runtime_answering(answer, body: bytes):
    """A real sagemaker-runtime client whose invoke_endpoint is stubbed (botocore's Stubber: moto's
    runtime takes text bodies only), asserting what invoke sends."""
    client = boto3.client(
        "sagemaker-runtime", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    payload = json.dumps({"modelname": "yolov5", "version": "1", "result": answer}).encode()
    stubber.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(payload), len(payload)), "ContentType": "application/json"},
        {
            "EndpointName": "local",
            "ContentType": "image/jpeg",
            "Accept": "application/json",
            "Body": body,
            "CustomAttributes": "modelname=yolov5",
        },
    )
    stubber.activate()
    return client


def test_invoke_draw_writes_boxes_at_the_returned_coordinates(tmp_path):
    image_path, out = tmp_path / "dog.jpg", tmp_path / "out.png"
    image_path.write_bytes(photo())
    runtime = runtime_answering(DETECTOR_ANSWER, image_path.read_bytes())
    assert invoke.main(["--draw", str(out), f"yolov5={image_path}"], client=runtime) == 0
    pixels = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert pixels.shape == (300, 400, 3)
    width = line_width(Image.open(out))
    for found in DETECTOR_ANSWER["detections"]:
        x1, y1, x2, y2 = (round(v) for v in found["box"])
        colour = PALETTE[found["class_id"] % len(PALETTE)]
        middle_y, middle_x = (y1 + y2) // 2, (x1 + x2) // 2
        # the outline's outer edge is the box: coloured on it, the photo just outside and inside
        for x, y in ((x1, middle_y), (x2, middle_y), (middle_x, y2)):
            assert np.abs(pixels[y, x] - colour).max() <= 2, (found["label"], x, y, pixels[y, x])
        for x, y in ((x1 - 1, middle_y), (x2 + 1, middle_y), (middle_x, min(y2 + 1, 299))):
            if y < 300 and x < 400:
                assert np.abs(pixels[y, x] - GREY).max() <= 3, (found["label"], x, y, pixels[y, x])
        assert np.abs(pixels[middle_y, x1 + width] - GREY).max() <= 3  # the outline is `width` thick
    # the label's box sits above the top edge, in the class's colour
    x1, y1 = (round(v) for v in DETECTOR_ANSWER["detections"][0]["box"][:2])
    assert np.abs(pixels[y1 - 3, x1 + 1] - PALETTE[16 % len(PALETTE)]).max() <= 2


def test_boxes_land_on_the_image_as_displayed():
    """An EXIF-rotated photo is drawn turned, as the model saw it (the answer's pixels)."""
    drawn = draw_answer(
        photo(300, 400, orientation=6),
        {"detections": [{"label": "x", "class_id": 3, "score": 0.5, "box": [10, 20, 390, 280]}]},
    )
    assert drawn.size == (400, 300)
    assert np.abs(np.asarray(drawn)[150, 390].astype(int) - PALETTE[3]).max() <= 2


def test_a_classifier_top_k_is_written_on_it(tmp_path):
    classes = [
        {"label": "golden retriever", "index": 207, "score": 0.8},
        {"label": "tennis ball", "index": 852, "score": 0.1},
    ]
    drawn = np.asarray(draw_answer(photo(), classes)).astype(int)
    corner = drawn[:40, :120]
    assert (corner == 0).all(axis=2).mean() > 0.5 and (corner > 200).all(axis=2).any()  # dark box, white text
    assert np.abs(drawn[250, 350] - GREY).max() <= 3  # the rest untouched


def test_a_text_answer_is_not_drawn():
    with pytest.raises(NotDrawable):
        draw_answer(photo(), [[{"token": "paris", "score": 0.5}]])


def test_a_segmenters_masks_are_laid_translucent_one_colour_a_prompt():
    from clients import rle
    from scripts.caller.drawing import MASK_OPACITY

    first, second = np.zeros((300, 400), bool), np.zeros((300, 400), bool)
    first[200:280, 20:120] = True
    second[10:90, 250:390] = True
    answer = [  # the second prompt with multimask_output: its best mask is drawn
        {"mask": rle.encode(first), "score": 0.9, "box": [20, 200, 119, 279]},
        [
            {"mask": rle.encode(second), "score": 0.8, "box": [250, 10, 389, 89]},
            {"mask": rle.encode(first), "score": 0.1, "box": [20, 200, 119, 279]},
        ],
    ]
    pixels = np.asarray(draw_answer(photo(), answer), dtype=np.float64)
    for (y, x), colour in (((270, 100), PALETTE[0]), ((80, 380), PALETTE[1])):
        expected = (1 - MASK_OPACITY) * np.asarray(GREY) + MASK_OPACITY * np.asarray(colour)
        assert np.abs(pixels[y, x] - expected).max() <= 3  # the JPEG's grey is within a level or two
    assert np.abs(pixels[150, 200] - GREY).max() <= 3  # outside every mask: the photo
    with pytest.raises(NotDrawable, match="the image 400x300"):
        draw_answer(photo(), [{"mask": rle.encode(np.ones((10, 10), bool)), "score": 0.5, "box": [0, 0, 9, 9]}])


def test_a_zero_shot_detectors_boxes_are_outlined_one_colour_a_label():
    found = [
        {"label": "a dog", "score": 0.8, "box": [50.4, 60.0, 200.2, 250.0]},
        {"label": "a ball", "score": 0.4, "box": [250.0, 30.0, 380.0, 120.0]},
        {"label": "a dog", "score": 0.2, "box": [-10.0, 150.0, 40.0, 290.0]},  # past the edge: not clipped
    ]
    drawn = np.asarray(draw_answer(photo(), found)).astype(int)
    for box, colour in ((found[0]["box"], PALETTE[0]), (found[1]["box"], PALETTE[1])):
        x1, y1, x2, y2 = (round(v) for v in box)
        assert np.abs(drawn[(y1 + y2) // 2, x1] - colour).max() <= 2  # the left edge in its label's colour
        assert np.abs(drawn[(y1 + y2) // 2, x2] - colour).max() <= 2
    assert np.abs(drawn[220, 40] - PALETTE[0]).max() <= 2  # the second dog in the first dog's colour
    assert np.abs(drawn[200, 120] - GREY).max() <= 3  # inside a box, the photo


def test_a_grounded_segmentation_draws_masks_and_boxes_one_colour_a_detection():
    from clients import rle
    from scripts.caller.drawing import MASK_OPACITY

    first, second = np.zeros((300, 400), bool), np.zeros((300, 400), bool)
    first[200:280, 20:120] = True
    second[100:190, 250:390] = True
    answer = [  # two detections of one label: two colours
        {
            "label": "a dog",
            "score": 0.7,
            "box": [20.0, 200.0, 119.5, 279.5],
            "mask": rle.encode(first),
            "mask_score": 0.9,
        },
        {
            "label": "a dog",
            "score": 0.6,
            "box": [250.0, 100.0, 389.5, 189.5],
            "mask": rle.encode(second),
            "mask_score": 0.8,
        },
    ]
    pixels = np.asarray(draw_answer(photo(), answer), dtype=np.float64)
    for (y, x), colour in (((260, 70), PALETTE[0]), ((150, 320), PALETTE[1])):
        expected = (1 - MASK_OPACITY) * np.asarray(GREY) + MASK_OPACITY * np.asarray(colour)
        assert np.abs(pixels[y, x] - expected).max() <= 1
    assert tuple(pixels[240, 20].astype(int)) == PALETTE[0]  # the first box's left edge
    assert tuple(pixels[150, 250].astype(int)) == PALETTE[1]


def test_the_drawing_is_written_in_the_format_its_name_says(tmp_path):
    drawn = draw_answer(photo(), {"detections": [{"label": "x", "class_id": 1, "score": 0.5, "box": [10, 20, 90, 80]}]})
    for name, kind in (("out.jpg", "JPEG"), ("out.JPEG", "JPEG"), ("out.png", "PNG"), ("out.drawn", "PNG")):
        with Image.open(save(drawn, tmp_path / name)) as written:
            assert written.format == kind, name
