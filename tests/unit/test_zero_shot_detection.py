"""The zero_shot_object_detection family (OWLv2, OWL-ViT, Grounding DINO) against the model and its
processor, in process: the router's client with the Triton model's own ``Detector``
(``app/triton/zsd_model.py``) standing in for Triton, on the "zsd" small-model set (a tiny OWLv2,
OWL-ViT and Grounding DINO of seeded random weights). Labels given as a list and as one phrase,
Grounding DINO's prompt and its phrases (text_threshold), thresholds, images of several shapes and
sizes (OWLv2's padding and blur, OWL-ViT's stretch, Grounding DINO's sizes: its graph traced on one),
each image of a list answered its own, a raw body with its text in the custom attributes; the numpy
pre-processing against the processors' pixels; and the bad inputs, each a 400 naming its field.
Tolerances: tests/zsd_reference.py (labels exact, scores 1e-4, boxes 0.05 pixel)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.core import zsd_contract as contract
from app.core.errors import InvalidInput
from app.core.settings import Settings
from app.triton.zsd_model import Detector, Refused, check_tokens
from clients.families import load_spec, make_client
from scripts.model_prep.small_models.sets import Built
from tests.support import ATTRIBUTES, b64, block_photo
from tests.zsd_reference import ZsdReference, assert_answer

OWL = ("owlv2_tiny", "owlvit_tiny")
MODELS = (*OWL, "gdino_tiny")
LABELS = ["a photo of a cat", "a remote control", "a dog", "the person"]


def photo(width: int = 140, height: int = 90, seed: int = 0, fmt: str = "PNG") -> bytes:
    return block_photo(width, height, seed, fmt=fmt)


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


class DetectorTriton:
    """A stand-in for Triton: the Triton model's Detector over the repository's graph, the calls counted."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.detectors: dict[str, Detector] = {}
        self.calls = 0

    def infer(self, model, inputs, output_names, version=None):
        if model not in self.detectors:
            spec = load_spec(self.repository / model)
            self.detectors[model] = Detector(spec.text, self.repository / model / "1", 1, [], 1_000_000)
        self.calls += 1
        logits, boxes = self.detectors[model].detect(
            inputs[contract.IMAGE].tobytes(), inputs[contract.INPUT_IDS], inputs[contract.ATTENTION_MASK]
        )
        return {contract.LOGITS: logits, contract.PRED_BOXES: boxes}, "1"


@pytest.fixture(scope="module")
def repository(small_models: Built) -> Path:
    return small_models.repository("zsd")


@pytest.fixture(scope="module")
def triton(repository: Path) -> DetectorTriton:
    return DetectorTriton(repository)


@pytest.fixture(scope="module", params=MODELS)
def served(request, repository: Path, triton: DetectorTriton, small_models: Built):
    settings = Settings(model_repository=repository, max_image_pixels=1_000_000, max_batch_items=8)
    client = make_client(load_spec(repository / request.param), triton, settings)
    return client, ZsdReference(small_models.models("zsd") / request.param / "hf")


@pytest.mark.parametrize(
    ("width", "height", "fmt"), [(140, 90, "PNG"), (61, 150, "PNG"), (640, 480, "JPEG"), (30, 700, "PNG")]
)
def test_answers_equal_the_reference(served, width, height, fmt):
    client, reference = served
    image = photo(width, height, seed=width, fmt=fmt)
    answer, _ = client.inference({"img": b64(image), "labels": LABELS})
    worst = assert_answer(answer, reference.detect(decoded(image), LABELS))
    assert worst["boxes"] > 0  # the seeded models find something: the comparison compares boxes
    print(f"{client.name} {width}x{height}: {worst}")


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.9])
def test_the_threshold_is_the_processors(served, threshold):
    client, reference = served
    image = photo(seed=7)
    answer, _ = client.inference({"img": b64(image), "labels": LABELS[:2], "threshold": threshold})
    assert_answer(answer, reference.detect(decoded(image), LABELS[:2], threshold))


def test_one_label_may_go_unlisted(served):
    client, reference = served
    image = photo(seed=8)
    answer, _ = client.inference({"img": b64(image), "labels": "a cat"})
    assert_answer(answer, reference.detect(decoded(image), ["a cat"]))
    if not reference.grounding:  # Grounding DINO's labels are its phrases (read from "a cat.")
        assert {a["label"] for a in answer} <= {"a cat"}


def test_each_image_of_a_list_is_answered_its_own(served, triton):
    client, reference = served
    images = [photo(seed=9), photo(200, 100, seed=10), photo(80, 120, seed=11)]
    before = triton.calls
    answers, _ = client.inference({"img": [b64(i) for i in images], "labels": LABELS})
    assert triton.calls - before == 3  # one Triton call an image
    for answer, image in zip(answers, images):
        assert_answer(answer, reference.detect(decoded(image), LABELS))
    assert answers[0] != answers[1]


@pytest.fixture(scope="module")
def grounding(repository: Path, triton: DetectorTriton, small_models: Built):
    settings = Settings(model_repository=repository, max_image_pixels=1_000_000, max_batch_items=8)
    client = make_client(load_spec(repository / "gdino_tiny"), triton, settings)
    return client, ZsdReference(small_models.models("zsd") / "gdino_tiny" / "hf")


@pytest.mark.parametrize(("threshold", "text_threshold"), [(None, 0.25), (0.4, 0.5), (0.6, 0.3), (0.45, 0.0)])
def test_a_grounding_prompt_and_its_phrases_equal_the_reference(grounding, threshold, text_threshold):
    client, reference = grounding
    prompt = "a red car. the dog on a couch."
    for seed, (width, height) in enumerate(((140, 90), (333, 200), (45, 300))):
        image = photo(width, height, seed=20 + seed)
        payload = {"img": b64(image), "text": prompt, "text_threshold": text_threshold}
        if threshold is not None:
            payload["threshold"] = threshold
        answer, _ = client.inference(payload)
        expected = reference.detect(decoded(image), prompt, threshold, text_threshold)
        worst = assert_answer(answer, expected)
        print(f"gdino {width}x{height} threshold {threshold} text_threshold {text_threshold}: {worst}")
    phrases = {a["label"] for a in answer}
    if text_threshold == 0.0:  # every token of the prompt scores above 0: each phrase is all of it
        assert phrases == {f"{prompt} [SEP]"}
    elif text_threshold >= 0.3:
        assert len(phrases) > 1  # phrases differ box to box: the phrase rules are compared


def test_grounding_labels_become_the_processors_prompt(grounding):
    client, _ = grounding
    joined = client.parse_options({"labels": [" A Cat", "a remote control "]})["queries"]
    prompted = client.parse_options({"text": "a cat. a remote control."})["queries"]
    assert joined.input_ids.tolist() == prompted.input_ids.tolist()
    assert joined.input_ids[0].tolist() == [101, 1030, 1033, 1012, 1030, 1035, 1036, 1012, 102]  # BERT's ids kept


def test_the_custom_attributes_carry_the_labels_of_a_raw_body(served):
    client, reference = served
    image = photo(seed=12)
    options = client.options_from_attributes({"labels": "a cat; a remote control", "threshold": "0.5"}, ATTRIBUTES)
    answer, _ = client.inference({"img": image, **options})
    assert_answer(answer, reference.detect(decoded(image), ["a cat", "a remote control"], 0.5))
    if reference.grounding:
        attributes = {"text": "a dog. a car.", "threshold": "0.5", "text_threshold": "0.4"}
        answer, _ = client.inference({"img": image, **client.options_from_attributes(attributes, ATTRIBUTES)})
        assert_answer(answer, reference.detect(decoded(image), "a dog. a car.", 0.5, 0.4))


def test_pixel_values_equal_the_processors(served):
    client, reference = served
    processing = client.processing
    for width, height, seed in ((140, 90, 0), (77, 120, 1), (64, 64, 2), (1000, 700, 3), (30, 50, 4)):
        pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
        want = reference.processor.image_processor(Image.fromarray(pixels), return_tensors="np")["pixel_values"][0]
        assert np.abs(processing.pixel_values(pixels) - want).max() <= 1e-5  # float rounding only


LONG = " ".join(["photo"] * 15)  # 17 tokens with the start and end tokens: over CLIP's 16
BAD = [
    ({}, "payload.labels", "required"),
    ({"labels": []}, "payload.labels", "non-empty list"),
    ({"labels": ["a cat", 3]}, "payload.labels[1]", "non-empty string"),
    ({"labels": ["a cat", "  "]}, "payload.labels[1]", "non-empty string"),
    ({"labels": ["a cat"] * (contract.MAX_LABELS + 1)}, "payload.labels", f"limit of {contract.MAX_LABELS}"),
    ({"labels": ["a cat", LONG]}, "payload.labels[1]", "17 tokens, over the text encoder's limit of 16"),
    ({"labels": ["a cat"], "threshold": 1.5}, "payload.threshold", ""),
    ({"labels": ["a cat"], "text_threshold": 0.3}, "payload.text_threshold", "Grounding DINO's"),
    ({"text": "a cat."}, "payload.text", "Grounding DINO's"),
]


GROUNDING_BAD = [
    ({}, "payload.labels or payload.text", "required"),
    ({"labels": ["a cat"], "text": "a cat."}, "payload.labels or payload.text", "not both"),
    ({"labels": ["a cat", "a dog. a car"]}, "payload.labels[1]", "holds a '.'"),
    ({"text": " "}, "payload.text", "non-empty string"),
    ({"text": "a " * 255}, "payload.text", "257 tokens, over the text encoder's limit of 256"),
    ({"labels": ["a cat"], "text_threshold": 1.5}, "payload.text_threshold", ""),
    ({"labels": ["a cat"] * (contract.MAX_LABELS + 1)}, "payload.labels", f"limit of {contract.MAX_LABELS}"),
]


@pytest.mark.parametrize(("fields", "named", "says"), BAD)
@pytest.mark.parametrize("model", OWL)
def test_bad_inputs_are_refused_naming_the_field(repository, triton, model, fields, named, says):
    settings = Settings(model_repository=repository, max_image_pixels=1_000_000, max_batch_items=8)
    client = make_client(load_spec(repository / model), triton, settings)
    with pytest.raises(InvalidInput) as refused:
        client.inference({"img": b64(photo()), **fields})
    assert named in refused.value.message and says in refused.value.message


@pytest.mark.parametrize(("fields", "named", "says"), GROUNDING_BAD)
def test_bad_grounding_inputs_are_refused_naming_the_field(grounding, fields, named, says):
    client, _ = grounding
    with pytest.raises(InvalidInput) as refused:
        client.inference({"img": b64(photo()), **fields})
    assert named in refused.value.message and says in refused.value.message


def test_images_that_do_not_decode_or_are_too_large_are_refused(served):
    client, _ = served
    with pytest.raises(InvalidInput, match="payload.img is not a decodable image"):
        client.inference({"img": b64(b"not an image"), "labels": ["a cat"]})
    with pytest.raises(InvalidInput, match="over the limit of 1000000"):
        client.inference({"img": b64(photo(1001, 1000)), "labels": ["a cat"]})
    truncated = photo(fmt="JPEG")[:200]  # a header that opens, pixels that do not decode: refused in Triton
    with pytest.raises(InvalidInput, match="payload.img"):
        client.inference({"img": b64(truncated), "labels": ["a cat"]})


def test_the_triton_model_refuses_tokens_the_router_would_not_send():
    ids = np.zeros((2, 16), dtype=np.int64)
    with pytest.raises(Refused, match=r"\[labels, 16\]"):
        check_tokens(ids[:, :8], ids[:, :8], 16, 100, False)
    with pytest.raises(Refused, match=f"1 to {contract.MAX_LABELS} rows"):
        check_tokens(np.zeros((contract.MAX_LABELS + 1, 16), np.int64), np.zeros((65, 16), np.int64), 16, 100, False)
    with pytest.raises(Refused, match="within|lie in"):
        check_tokens(ids + 100, ids, 16, 100, False)
    check_tokens(ids, ids + 1, 16, 100, False)
    with pytest.raises(Refused, match=r"\[1, 1 to 256\]"):
        check_tokens(np.zeros((1, 257), np.int64), np.ones((1, 257), np.int64), 256, 100, True)
    with pytest.raises(Refused, match="1 to 1 rows"):
        check_tokens(ids, ids, 256, 100, True)
    check_tokens(ids[:1], ids[:1] + 1, 256, 100, True)


def test_the_traced_text_masks_equal_grounding_dinos():
    """gdino_tracing.text_masks, which the graph holds instead of isin / cummax / cummin, gives
    Grounding DINO's own attention masks and position ids (bit for bit) on prompts of special tokens
    in any places."""
    import torch
    from transformers.models.grounding_dino.modeling_grounding_dino import (
        SPECIAL_TOKENS,
        generate_masks_with_special_tokens_and_transfer_map,
    )

    from scripts.model_prep.gdino_tracing import text_masks

    generator = torch.Generator().manual_seed(0)
    special = torch.tensor(SPECIAL_TOKENS)
    for length in (2, 5, 9, 40):
        choices = torch.tensor([*SPECIAL_TOKENS, 1030, 1031, 1033, 1040])
        ids = choices[torch.randint(len(choices), (6, length), generator=generator)]
        ids[:, 0], ids[:, -1] = 101, 102
        want = generate_masks_with_special_tokens_and_transfer_map(ids, special)
        found = text_masks(ids, special)
        assert torch.equal(want[0], found[0]) and torch.equal(want[1], found[1])
