"""The zero_shot_object_detection family (OWLv2, OWL-ViT, Grounding DINO) through the whole stack (NGINX, gunicorn,
the router, a real Triton running app/triton/zsd_model.py) against the models and their processors:
the "zsd" small-model set, served from a copy of its own. Both request forms (the JSON envelope and a
raw image body with the labels in the custom attributes), several images in one request, JSON Lines,
callers at once with images of their own, /ping, the OpenAPI contract, the per-model metrics, and bad
input (400s naming the field; the endpoint keeps serving); a detector's archive on a multi-model
endpoint is tests/integration/test_grounded_segmentation.py's, beside SAM's and the chain's.
Tolerances: tests/zsd_reference.py (labels exact, scores 1e-4, boxes 0.05 pixel)."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from PIL import Image

from scripts.devtools import Stack
from scripts.model_prep.small_models.sets import Built
from tests.references import served_copy
from tests.support import ONE_INSTANCE, assert_conforms, assert_error, b64, block_photo, post
from tests.zsd_reference import ZsdReference, assert_answer

pytestmark = pytest.mark.integration

MODELS = ("owlv2_tiny", "owlvit_tiny", "gdino_tiny")
LABELS = ["a photo of a cat", "a remote control", "a dog"]


def photo(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    return block_photo(width, height, seed, fmt=fmt)


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def references(small_models: Built) -> dict[str, ZsdReference]:
    return {name: ZsdReference(small_models.models("zsd") / name / "hf") for name in MODELS}


@pytest.fixture(scope="module")
def zsd_stack(small_models: Built, tmp_path_factory, stopping: list[Stack]):
    repository = served_copy(small_models.repository("zsd"), MODELS, tmp_path_factory.mktemp("zsd-repository"))
    started = Stack(repository, env_extra=ONE_INSTANCE).start(tmp_path_factory.mktemp("zsd-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


def result(stack: Stack, model: str, payload: dict):
    r = post(stack, {"modelname": model, "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


def test_ping_names_the_models_ready(zsd_stack):
    r = requests.get(f"{zsd_stack.url}/ping", timeout=10)
    assert r.status_code == 200
    assert all(f'"{name}"' in r.text for name in MODELS), r.text


@pytest.mark.parametrize("model", MODELS)
def test_answers_equal_the_reference(zsd_stack, references, model):
    image = photo(140, 90, 0, "JPEG")
    answer = result(zsd_stack, model, {"img": b64(image), "labels": LABELS})
    worst = assert_answer(answer, references[model].detect(decoded(image), LABELS))
    assert worst["boxes"] > 0
    print(f"{model}: {worst}")
    images = [photo(200, 120, 1), photo(70, 160, 2)]  # one request, two images: each its own answer
    answers = result(zsd_stack, model, {"img": [b64(i) for i in images], "labels": LABELS, "threshold": 0.2})
    for answer, image in zip(answers, images):
        assert_answer(answer, references[model].detect(decoded(image), LABELS, 0.2))


def test_a_raw_image_body_takes_its_labels_from_the_custom_attributes(zsd_stack, references):
    image = photo(120, 200, 3)
    r = post(zsd_stack, image, "image/png", "modelname=owlvit_tiny,labels=a cat;a remote control,threshold=0.15")
    assert r.status_code == 200, r.text[:500]
    expected = references["owlvit_tiny"].detect(decoded(image), ["a cat", "a remote control"], 0.15)
    assert_answer(r.json()["result"], expected)


def test_a_grounding_prompt_in_both_forms_equals_the_reference(zsd_stack, references):
    image = photo(300, 180, 5, "JPEG")
    prompt = "a red car. the dog on a couch."
    payload = {"img": b64(image), "text": prompt, "threshold": 0.45, "text_threshold": 0.3}
    answer = result(zsd_stack, "gdino_tiny", payload)
    print(f"gdino: {assert_answer(answer, references['gdino_tiny'].detect(decoded(image), prompt, 0.45, 0.3))}")
    r = post(zsd_stack, image, "image/jpeg", f"modelname=gdino_tiny,text={prompt},text_threshold=0.3")
    assert r.status_code == 200, r.text[:500]
    assert_answer(r.json()["result"], references["gdino_tiny"].detect(decoded(image), prompt, None, 0.3))


def test_json_lines_and_callers_at_once_are_each_answered_their_own(zsd_stack, references):
    images = [photo(100 + 20 * i, 80 + 10 * i, 10 + i) for i in range(6)]
    models = [MODELS[i % 3] for i in range(len(images))]

    def call(index: int):
        return result(zsd_stack, models[index], {"img": b64(images[index]), "labels": LABELS})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(call, range(len(images))))
    for answer, image, model in zip(answers, images, models):
        assert_answer(answer, references[model].detect(decoded(image), LABELS))
    lines = "\n".join(
        json.dumps({"modelname": model, "payload": {"img": b64(image), "labels": LABELS[:2]}})
        for model, image in zip(models[:3], images[:3])
    )
    r = post(zsd_stack, lines, "application/jsonlines")
    assert r.status_code == 200, r.text[:300]
    for line, image, model in zip(r.text.splitlines(), images, models):
        assert_answer(json.loads(line)["result"], references[model].detect(decoded(image), LABELS[:2]))


BAD = [
    ({}, "payload.labels"),
    ({"labels": []}, "payload.labels"),
    ({"labels": ["a cat"] * 65}, "over the limit of 64"),
    ({"labels": ["a cat", " ".join(["photo"] * 15)]}, "payload.labels[1]"),
    ({"labels": ["a cat"], "threshold": 2}, "payload.threshold"),
]


def test_bad_input_is_a_400_naming_the_field_and_the_endpoint_keeps_serving(zsd_stack):
    image = b64(photo(140, 90, 0))
    for fields, named in BAD:
        r = post(zsd_stack, {"modelname": "owlv2_tiny", "payload": {"img": image, **fields}})
        assert_error(r, 400, "invalid_input", named)
    r = post(zsd_stack, {"modelname": "owlv2_tiny", "payload": {"img": b64(b"not an image"), "labels": LABELS}})
    assert_error(r, 400, "invalid_input", "payload.img")
    truncated = b64(photo(140, 90, 0, "JPEG")[:300])  # its header opens in the router; its pixels fail in Triton
    r = post(zsd_stack, {"modelname": "owlv2_tiny", "payload": {"img": truncated, "labels": LABELS}})
    assert_error(r, 400, "invalid_input", "payload.img")
    r = post(zsd_stack, photo(140, 90, 0), "image/png", "modelname=owlv2_tiny")  # a raw body without labels
    assert_error(r, 400, "invalid_input", "labels")
    for fields, named in (({"text": "a " * 255}, "over the text encoder's limit of 256"), ({}, "payload.labels or")):
        r = post(zsd_stack, {"modelname": "gdino_tiny", "payload": {"img": image, **fields}})
        assert_error(r, 400, "invalid_input", named)
    assert requests.get(f"{zsd_stack.url}/ping", timeout=10).status_code == 200
    assert result(zsd_stack, "owlv2_tiny", {"img": image, "labels": LABELS}) is not None


def counted(stack: Stack, metric: str, model: str) -> float:
    """A counter's value for the model, as /metrics answers it (0 before its first count)."""
    text = requests.get(f"{stack.url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith(f"{metric}{{") and f'model="{model}"' in line]
    return sum(float(line.split()[-1]) for line in lines)


def test_the_requests_and_their_detections_are_counted_by_model(zsd_stack):
    before = counted(zsd_stack, "router_detections_total", "owlvit_tiny")
    answer = result(zsd_stack, "owlvit_tiny", {"img": b64(photo(140, 90, 0)), "labels": LABELS})
    assert counted(zsd_stack, "router_requests_total", "owlvit_tiny") >= 1
    assert counted(zsd_stack, "router_detections_total", "owlvit_tiny") - before == len(answer) > 0
