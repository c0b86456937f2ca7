"""The mask_generation family (SAM, SAM-HQ) through the whole stack (NGINX, gunicorn, the router, a
real Triton running app/triton/sam_model.py) against SamModel + SamProcessor (SamHQModel +
SamHQProcessor): the "sam" small-model set (two tiny SAMs of other seeds and a tiny SAM-HQ), served
from a copy of its own, one stack for the three; the answers' tests run on a SAM and on the SAM-HQ. Both request forms (the JSON envelope
and a raw image body with the prompts in the custom attributes), JSON Lines, callers at once with
images of their own, /ping, the OpenAPI contract, the per-model metrics, and bad input (400s naming
the field; the endpoint keeps serving); without prompts, the whole image against
pipeline("mask-generation") with the same options. Tolerances: tests/sam_reference.py."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from PIL import Image

from app.core import mask_contract as contract
from scripts.devtools import Stack
from scripts.model_prep.small_models.sets import Built
from tests.references import served_copy
from tests.sam_reference import SamReference, assert_answers, assert_whole_image
from tests.support import ONE_INSTANCE, assert_conforms, assert_error, b64, block_photo, post
from tests.v2 import direct, post_v2, read_answer, v2_request

pytestmark = pytest.mark.integration

MODELS = ("sam_tiny", "sam_other", "samhq_tiny")
HQ = "samhq_tiny"
BOXES = [[10, 20, 120, 100], [60, 5, 230, 170]]
POINTS = [[[50, 40]], [[100, 70], [20, 130]]]
LABELS = [[1], [1, 0]]


def photo(width: int, height: int, seed: int) -> bytes:
    return block_photo(width, height, seed, block=12, noise=0.0)


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def references(small_models: Built) -> dict[str, SamReference]:
    return {name: SamReference(small_models.models("sam") / name / "hf") for name in MODELS}


@pytest.fixture(scope="module")
def sam_stack(small_models: Built, tmp_path_factory, stopping: list[Stack]):
    repository = served_copy(small_models.repository("sam"), MODELS, tmp_path_factory.mktemp("sam-repository"))
    started = Stack(repository, env_extra=ONE_INSTANCE).start(tmp_path_factory.mktemp("sam-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


def result(stack: Stack, model: str, payload: dict):
    r = post(stack, {"modelname": model, "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


def test_ping_names_the_models_ready(sam_stack):
    r = requests.get(f"{sam_stack.url}/ping", timeout=10)
    assert r.status_code == 200
    assert all(f'"{name}"' in r.text for name in MODELS), r.text


@pytest.mark.parametrize("model", ["sam_tiny", HQ])
@pytest.mark.parametrize("multimask", [False, True])
def test_boxes_and_points_equal_the_reference(sam_stack, references, model, multimask):
    image = photo(240, 180, 0)
    answers = result(sam_stack, model, {"img": b64(image), "boxes": BOXES, "multimask_output": multimask})
    expected = references[model].prompts(decoded(image), boxes=BOXES, multimask=multimask)
    print(f"{model} boxes multimask={multimask}: {assert_answers(answers, expected, multimask)}")
    payload = {"img": b64(image), "points": POINTS, "point_labels": LABELS, "multimask_output": multimask}
    answers = result(sam_stack, model, payload)
    expected = references[model].prompts(decoded(image), points=POINTS, labels=LABELS, multimask=multimask)
    print(f"{model} points multimask={multimask}: {assert_answers(answers, expected, multimask)}")


@pytest.mark.parametrize("model", ["sam_other", HQ])
def test_a_raw_image_body_takes_its_prompts_from_the_custom_attributes(sam_stack, references, model):
    image = photo(200, 260, 1)
    attributes = f"modelname={model},boxes=10 20 120 100;60 5 190 170,points=50 40;100 70 20 130,point_labels=1;1 0"
    r = post(sam_stack, image, "image/png", attributes)
    assert r.status_code == 200, r.text[:500]
    boxes = [[10, 20, 120, 100], [60, 5, 190, 170]]
    expected = references[model].prompts(decoded(image), boxes=boxes, points=POINTS, labels=LABELS)
    assert_answers(r.json()["result"], expected, False)


def test_json_lines_and_callers_at_once_are_each_answered_their_own(sam_stack, references):
    images = [photo(160 + 20 * i, 120 + 10 * i, 10 + i) for i in range(6)]
    models = [MODELS[i % len(MODELS)] for i in range(len(images))]

    def call(index: int):
        return result(sam_stack, models[index], {"img": b64(images[index]), "boxes": BOXES[:1]})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(call, range(len(images))))
    for answer, image, model in zip(answers, images, models):
        assert_answers(answer, references[model].prompts(decoded(image), boxes=BOXES[:1]), False)
    lines = "\n".join(
        json.dumps({"modelname": model, "payload": {"img": b64(image), "boxes": BOXES[:1]}})
        for model, image in zip(models[:3], images[:3])
    )
    r = post(sam_stack, lines, "application/jsonlines")
    assert r.status_code == 200, r.text[:300]
    for line, image, model in zip(r.text.splitlines(), images, models):
        assert_answers(json.loads(line)["result"], references[model].prompts(decoded(image), boxes=BOXES[:1]), False)


# The tiny model's random masks are noisy and mostly span the image: these options keep several of a
# small grid's (4 x 4 points in batches of 5: the last batch short) through the filters and the NMS.
WHOLE = {
    "points_per_crop": 4,
    "points_per_batch": 5,
    "pred_iou_thresh": 0.1,
    "mask_threshold": 0.15,
    "stability_score_offset": 0.01,
    "stability_score_thresh": 0.5,
    "crops_nms_thresh": 0.95,
}
# The tiny SAM-HQ's masks each span the whole image (one box for all): past an NMS at 0.95 one is left.
WHOLE_OF = {"sam_other": WHOLE, HQ: {**WHOLE, "crops_nms_thresh": 1.0}}


@pytest.mark.parametrize("model", ["sam_other", HQ])
def test_the_whole_image_without_prompts_equals_the_mask_generation_pipeline(sam_stack, references, model):
    image, options = photo(120, 90, 0), WHOLE_OF[model]
    answers = result(sam_stack, model, {"img": b64(image), **options})
    expected = references[model].whole_image(decoded(image), **options)
    print(f"{model} whole image: {len(answers)} masks, {assert_whole_image(answers, expected, at_least=3)}")
    attributes = f"modelname={model}," + ",".join(f"{name}={value}" for name, value in options.items())
    r = post(sam_stack, image, "image/png", attributes)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["result"] == answers


BAD = [
    ({"boxes": [[10, 20, 5, 30]]}, "payload.boxes[0]"),
    ({"boxes": [[10, 20, 500, 30]]}, "payload.boxes[0]"),
    ({"points": [[[10, 10]], [[20, 20]]], "point_labels": [[1]]}, "payload.point_labels"),
    ({"boxes": [[0, 0, 5, 5]] * 65}, "over the limit of 64"),
    ({"points_per_crop": 65}, "payload.points_per_crop"),
    ({"pred_iou_thresh": 2}, "payload.pred_iou_thresh"),
    ({"boxes": BOXES, "points_per_batch": 8}, "payload.points_per_batch"),
    ({"multimask_output": True}, "payload.multimask_output"),
]


@pytest.mark.parametrize("model", ["sam_tiny", HQ])
def test_bad_input_is_a_400_naming_the_field_and_the_endpoint_keeps_serving(sam_stack, model):
    image = b64(photo(240, 180, 0))
    for fields, named in BAD:
        r = post(sam_stack, {"modelname": model, "payload": {"img": image, **fields}})
        assert_error(r, 400, "invalid_input", named)
    r = post(sam_stack, {"modelname": model, "payload": {"img": b64(b"not an image"), "boxes": BOXES}})
    assert_error(r, 400, "invalid_input", "payload.img")
    truncated = b64(photo(240, 180, 0)[:300])  # its header opens in the router; its pixels fail in Triton
    r = post(sam_stack, {"modelname": model, "payload": {"img": truncated, "boxes": BOXES}})
    assert_error(r, 400, "invalid_input", "payload.img")
    assert requests.get(f"{sam_stack.url}/ping", timeout=10).status_code == 200
    assert result(sam_stack, model, {"img": image, "boxes": BOXES[:1]})


def test_the_masks_are_counted_by_model(sam_stack):
    result(sam_stack, "sam_other", {"img": b64(photo(240, 180, 0)), "boxes": BOXES, "multimask_output": True})
    metrics = requests.get(f"{sam_stack.url}/metrics", timeout=10).text
    counted = [line for line in metrics.splitlines() if line.startswith('router_masks_total{model="sam_other"}')]
    assert counted and float(counted[0].split()[-1]) >= 6, counted


def test_kserve_v2_bodies_leave_out_the_grid_or_the_prompts(sam_stack):
    """A v2 body (tritonclient's helpers, binary+json) sends the prompts without ``grid``, or a grid
    without ``input_points`` and ``input_labels``: the model's own tensors answer, equal to a direct
    gRPC call that sends the unused inputs empty (as the router does); a body of the image alone is a
    400 naming both, and the endpoint keeps serving."""
    image = np.frombuffer(photo(240, 180, 0), np.uint8)
    prompts = {
        contract.POINTS: np.array([[[20, 15], [0, 0]]], np.float32),
        contract.LABELS: np.array([[contract.FOREGROUND, contract.NOT_A_POINT]], np.int64),
    }
    settings = {**contract.GRID_DEFAULTS, **WHOLE}
    grid = np.array([settings[name] for name in contract.GRID_SETTINGS], np.float64)
    no_prompts = {contract.POINTS: np.zeros((0, 0, 2), np.float32), contract.LABELS: np.zeros((0, 0), np.int64)}
    named = {"X-Amzn-SageMaker-Custom-Attributes": "modelname=sam_tiny"}
    cases = [
        (prompts, {**prompts, contract.GRID: np.zeros(0, np.float64)}, [contract.IOU_SCORES, contract.PRED_MASKS]),
        ({contract.GRID: grid}, {**no_prompts, contract.GRID: grid}, [contract.GRID_SCORES, contract.GRID_BOXES]),
    ]
    for sent, full, outputs in cases:
        body, json_size = v2_request({contract.IMAGE: image, **sent}, outputs, binary=True)
        r = post_v2(sam_stack, body, json_size, **named)
        assert r.status_code == 200, r.text[:300]
        answer, expected = read_answer(r), direct(sam_stack, "sam_tiny", {contract.IMAGE: image, **full}, outputs)
        for name in outputs:
            assert answer.as_numpy(name).shape == expected[name].shape and expected[name].size > 0, name
            assert np.array_equal(answer.as_numpy(name), expected[name]), name
    body, json_size = v2_request({contract.IMAGE: image}, [contract.IOU_SCORES], binary=True)
    r = post_v2(sam_stack, body, json_size, **named)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input", r.text[:300]
    assert "input_points" in r.json()["error"]["message"] and "grid" in r.json()["error"]["message"]
    assert sam_stack.ping().status_code == 200
