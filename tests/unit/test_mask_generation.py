"""The mask_generation family (SAM, SAM-HQ) against SamModel + SamProcessor (SamHQModel +
SamHQProcessor), in process: the router's client with the Triton model's own ``Segmenter``
(``app/triton/sam_model.py``) standing in for Triton, on the "sam" small-model set (a tiny SAM and a
tiny SAM-HQ of seeded random weights: each test runs on both). Boxes, points (one, several, with
background points, of different counts in one request), points with boxes, multimask (best first),
the threshold, images of other shapes, each image of a list answered its own; the numpy
pre-processing against the processor's pixels; and the bad inputs, each a 400 naming its field.
Tolerances: tests/sam_reference.py (scores 1e-4; at most 0.1 % of a mask's pixels differ, each
within 1e-4 of the threshold)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.core import mask_contract as contract
from app.core.errors import InvalidInput, InvalidItem
from app.core.settings import Settings
from app.triton.sam_model import Refused, Segmenter, check_prompts, run_request
from clients import sam_image
from clients.families import load_spec, make_client
from scripts.model_prep.small_models.sets import Built
from tests.sam_reference import SamReference, assert_answers
from tests.support import b64, block_photo

PHOTO_SIZE = (240, 180)  # width, height


def photo(width: int = PHOTO_SIZE[0], height: int = PHOTO_SIZE[1], seed: int = 0, fmt: str = "PNG") -> bytes:
    """Large smooth regions (a random model's masks still take shapes), encoded losslessly."""
    return block_photo(width, height, seed, block=12, noise=0.0, fmt=fmt)


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


class SegmenterTriton:
    """A stand-in for Triton: the Triton model's Segmenter over the repository's graphs, the calls counted."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.segmenters: dict[str, Segmenter] = {}
        self.calls = 0

    def segmenter(self, model: str) -> Segmenter:
        if model not in self.segmenters:
            spec = load_spec(self.repository / model)
            self.segmenters[model] = Segmenter(
                spec.text.folder, self.repository / model / "1", 1, ["CPUExecutionProvider"], 1_000_000
            )
        return self.segmenters[model]

    def infer(self, model, inputs, output_names, version=None):
        segmenter = self.segmenter(model)
        self.calls += 1
        try:
            return run_request(segmenter, inputs), "1"
        except InvalidItem as error:  # as clients.triton turns Triton's INVALID_ARG into it
            raise InvalidItem(0, error.message) from None


@pytest.fixture(scope="module")
def repository(small_models: Built) -> Path:
    return small_models.repository("sam")


@pytest.fixture(scope="module")
def triton(repository: Path) -> SegmenterTriton:
    return SegmenterTriton(repository)


MODELS = ("sam_tiny", "samhq_tiny")  # SAM and SAM-HQ: the same prompts, options and answers


@pytest.fixture(scope="module", params=MODELS)
def model(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def client(repository: Path, triton: SegmenterTriton, model: str):
    settings = Settings(model_repository=repository, max_image_pixels=1_000_000, max_batch_items=8)
    return make_client(load_spec(repository / model), triton, settings)


@pytest.fixture(scope="module")
def reference(small_models: Built, model: str) -> SamReference:
    return SamReference(small_models.models("sam") / model / "hf")


@pytest.fixture(scope="module")
def sam_reference(small_models: Built) -> SamReference:
    """SAM's, for the processor alone (SAM-HQ's image processor is the same ``SamImageProcessor``)."""
    return SamReference(small_models.models("sam") / "sam_tiny" / "hf")


BOXES = [[10, 20, 120, 100], [60, 5, 230, 170], [0, 0, 240, 180], [100.5, 40.25, 140.75, 90.5]]
POINTS = [[[50, 40]], [[100, 70], [20, 130]], [[200, 150], [30, 30], [120, 90]]]
LABELS = [[1], [1, 0], [0, 1, 1]]


@pytest.mark.parametrize("multimask", [False, True])
def test_boxes_equal_the_reference(client, reference, multimask):
    image = photo()
    answers, _ = client.inference({"img": b64(image), "boxes": BOXES, "multimask_output": multimask})
    worst = assert_answers(answers, reference.prompts(decoded(image), boxes=BOXES, multimask=multimask), multimask)
    print(f"boxes multimask={multimask}: {worst}")


@pytest.mark.parametrize("multimask", [False, True])
def test_points_of_different_counts_equal_the_reference(client, reference, multimask):
    image = photo(seed=1)
    payload = {"img": b64(image), "points": POINTS, "point_labels": LABELS, "multimask_output": multimask}
    answers, _ = client.inference(payload)
    expected = reference.prompts(decoded(image), points=POINTS, labels=LABELS, multimask=multimask)
    print(f"points multimask={multimask}: {assert_answers(answers, expected, multimask)}")


def test_points_with_boxes_and_a_threshold_equal_the_reference(client, reference):
    image = photo(seed=2)
    boxes, points = BOXES[:3], POINTS
    payload = {"img": b64(image), "boxes": boxes, "points": points, "point_labels": LABELS, "mask_threshold": 0.25}
    answers, _ = client.inference(payload)
    expected = reference.prompts(decoded(image), boxes=boxes, points=points, labels=LABELS)
    assert_answers(answers, expected, False, threshold=0.25)


def test_one_box_and_one_prompt_of_points_may_go_unlisted(client, reference):
    image = photo(seed=3)
    answers, _ = client.inference({"img": b64(image), "points": [[60, 60], [90, 40]]})
    assert_answers(answers, reference.prompts(decoded(image), points=[[[60, 60], [90, 40]]]), False)
    answers, _ = client.inference({"img": b64(image), "boxes": [5, 5, 100, 80]})
    assert_answers(answers, reference.prompts(decoded(image), boxes=[[5, 5, 100, 80]]), False)


@pytest.mark.parametrize("size", [(100, 300), (257, 256), (31, 47)])
def test_images_of_other_shapes_equal_the_reference(client, reference, size):
    width, height = size
    image = photo(width, height, seed=4, fmt="JPEG")
    boxes = [[0, 0, width, height], [width / 4, height / 4, width / 2, height / 2]]
    answers, _ = client.inference({"img": b64(image), "boxes": boxes, "multimask_output": True})
    assert_answers(answers, reference.prompts(decoded(image), boxes=boxes, multimask=True), True)


def test_each_image_of_a_list_is_answered_its_own_with_one_encoder_run(client, reference, triton):
    images = [photo(seed=5), photo(seed=6)]
    before = triton.calls
    answers, _ = client.inference({"img": [b64(i) for i in images], "boxes": BOXES[:2]})
    assert triton.calls - before == 2  # one Triton call (one image embedding) per image, for both prompts
    for answer, image in zip(answers, images):
        assert_answers(answer, reference.prompts(decoded(image), boxes=BOXES[:2]), False)
    assert answers[0][0]["mask"] != answers[1][0]["mask"]


def test_pixel_values_equal_the_processors(small_models: Built, sam_reference):
    processing = sam_image.Processing.read(small_models.models("sam") / "sam_tiny" / "hf")
    for width, height, seed in ((240, 180, 0), (333, 1000, 1), (37, 150, 2), (1000, 999, 3), (250, 40, 4)):
        rng = np.random.default_rng(seed)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        want = sam_reference.processor(images=Image.fromarray(pixels), return_tensors="np")
        values, resized = sam_image.pixel_values(pixels, processing)
        assert list(resized) == [int(v) for v in want["reshaped_input_sizes"][0]]
        assert np.abs(values - want["pixel_values"][0]).max() <= 1e-6  # the same pixels: float rounding only


def test_mask_logits_equal_post_process_masks(sam_reference):
    import torch

    rng = np.random.default_rng(0)
    for original, padded, low in (((576, 768), 256, 64), ((1000, 333), 1024, 256), ((37, 150), 256, 64)):
        resized = sam_image.resized_size(*original, padded)
        masks = rng.standard_normal((2, 3, low, low)).astype(np.float32)
        want = sam_reference.processor.image_processor.post_process_masks(
            torch.from_numpy(masks[None]),
            [original],
            [resized],
            binarize=False,
            pad_size={"height": padded, "width": padded},
        )[0].numpy()
        found = sam_image.mask_logits(masks, resized, original, (padded, padded))
        assert np.abs(found - want).max() <= 1e-4


BAD = [
    ({"boxes": [[10, 20, 5, 30]]}, "payload.boxes[0]", "x1 < x0"),
    ({"boxes": [[10, 20, 300, 30]]}, "payload.boxes[0]", "outside the image"),
    ({"boxes": [[-1, 0, 10, 10]]}, "payload.boxes[0]", "outside the image"),
    ({"boxes": [[1, 2, 3]]}, "payload.boxes[0]", "[x0, y0, x1, y1]"),
    ({"points": [[[10, 10]], [[20, 20]]], "point_labels": [[1]]}, "payload.point_labels", "shaped as points"),
    ({"points": [[[10, 10], [5, 5]]], "point_labels": [[1]]}, "payload.point_labels", "shaped as points"),
    ({"points": [[[10, 10]]], "point_labels": [[2]]}, "payload.point_labels[0]", "1 (foreground) or 0"),
    ({"points": [[[10, 500]]]}, "payload.points[0]", "outside the image"),
    ({"point_labels": [[1]]}, "payload.point_labels", "without"),
    ({"boxes": [[0, 0, 5, 5]] * (contract.MAX_PROMPTS + 1)}, "payload", f"limit of {contract.MAX_PROMPTS}"),
    ({"boxes": [[0, 0, 5, 5]] * 2, "points": [[[1, 1]]]}, "payload.boxes", "prompt i is box i"),
    ({"boxes": [[0, 0, 5, 5]], "multimask_output": "yes"}, "payload.multimask_output", ""),
    ({"boxes": [[0, 0, 5, 5]], "points_per_crop": 4}, "payload.points_per_crop", "whole image"),
    ({"points": [[1, 1]], "crops_nms_thresh": 0.5}, "payload.crops_nms_thresh", "whole image"),
    ({"multimask_output": False}, "payload.multimask_output", "boxes and points"),
    ({"points_per_crop": 65}, "payload.points_per_crop", "between 1 and 64"),
    ({"points_per_crop": 2.5}, "payload.points_per_crop", "integer"),
    ({"points_per_batch": 0}, "payload.points_per_batch", "between 1 and 256"),
    ({"pred_iou_thresh": 1.5}, "payload.pred_iou_thresh", "between 0 and 1"),
    ({"stability_score_thresh": -0.5}, "payload.stability_score_thresh", "between 0 and 1"),
    ({"stability_score_offset": -1}, "payload.stability_score_offset", "between 0 and 1000"),
    ({"crops_nms_thresh": "high"}, "payload.crops_nms_thresh", "a number"),
    ({"crops_n_layers": 1}, "payload.crops_n_layers", "not an option"),
]


@pytest.mark.parametrize(("fields", "named", "says"), BAD)
def test_bad_prompts_are_refused_naming_the_field(client, fields, named, says):
    with pytest.raises(InvalidInput) as refused:
        client.inference({"img": b64(photo()), **fields})
    assert named in refused.value.message and says in refused.value.message


def test_images_that_do_not_decode_or_are_too_large_are_refused(client):
    with pytest.raises(InvalidInput, match="payload.img is not a decodable image"):
        client.inference({"img": b64(b"not an image"), "boxes": [[0, 0, 5, 5]]})
    with pytest.raises(InvalidInput, match="over the limit of 1000000"):
        client.inference({"img": b64(photo(1001, 1000)), "boxes": [[0, 0, 5, 5]]})
    truncated = photo(fmt="JPEG")[:200]  # a header that opens, pixels that do not decode: refused in Triton
    with pytest.raises(InvalidInput, match="payload.img"):
        client.inference({"img": b64(truncated), "boxes": [[0, 0, 5, 5]]})


def test_the_custom_attributes_carry_the_prompts_of_a_raw_body(client, reference):
    attributes = {"boxes": "10 20 120 100;60 5 230 170", "multimask_output": "true"}
    payload = {"img": photo(), **client.options_from_attributes(attributes, "X-Amzn-SageMaker-Custom-Attributes")}
    answers, _ = client.inference(payload)
    assert_answers(answers, reference.prompts(decoded(photo()), boxes=BOXES[:2], multimask=True), True)
    attributes = {"points": "100 70 20 130;50 40", "point_labels": "1 0;1"}
    payload = {"img": photo(), **client.options_from_attributes(attributes, "X-Amzn-SageMaker-Custom-Attributes")}
    answers, _ = client.inference(payload)
    expected = reference.prompts(decoded(photo()), points=[POINTS[1], POINTS[0]], labels=[[1, 0], [1]])
    assert_answers(answers, expected, False)
    with pytest.raises(InvalidInput, match="X-Amzn-SageMaker-Custom-Attributes boxes"):
        client.options_from_attributes({"boxes": "1 2 3"}, "X-Amzn-SageMaker-Custom-Attributes")


def test_the_triton_model_refuses_values_the_router_would_not_send():
    points = np.zeros((1, 2, 2), dtype=np.float32)
    with pytest.raises(Refused, match="SAM's labels"):
        check_prompts(points, np.array([[7, contract.ABSENT]]), (10, 10))
    with pytest.raises(Refused, match="ABSENT after them"):
        check_prompts(points, np.array([[contract.ABSENT, 1]]), (10, 10))
    with pytest.raises(Refused, match="within the resized image"):
        check_prompts(points + 11, np.array([[1, contract.NOT_A_POINT]]), (10, 10))
    assert check_prompts(points, np.array([[1, contract.ABSENT]]), (10, 10)).tolist() == [1]


class Counted:
    """An ONNX Runtime session whose runs are counted."""

    def __init__(self, session) -> None:
        self.session, self.runs = session, 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self.session.run(*args, **kwargs)


WHOLE = {  # options under which several of the tiny model's masks survive (its random masks are noisy)
    "points_per_crop": 4,
    "pred_iou_thresh": 0.1,
    "mask_threshold": 0.1,
    "stability_score_offset": 0.01,
    "stability_score_thresh": 0.5,
    "crops_nms_thresh": 1.0,
}


def test_the_whole_image_is_one_call_one_embedding_and_its_batches_change_nothing(client, triton, model):
    from tests.sam_reference import mask_of

    image = photo(120, 90, seed=7)
    answers = {}
    for per_batch in (1, 16):
        before = triton.calls
        answers[per_batch], _ = client.inference({"img": b64(image), **WHOLE, "points_per_batch": per_batch})
        segmenter = triton.segmenter(model)
        assert triton.calls - before == 1
        if per_batch == 1:  # from the second call on, the encoder's and the decoder's runs are counted
            segmenter.encoder, segmenter.decoder = Counted(segmenter.encoder), Counted(segmenter.decoder)
    assert (segmenter.encoder.runs, segmenter.decoder.runs) == (1, 1)  # 16 points, one batch
    one, all_at_once = answers[1], answers[16]
    assert 3 <= len(one) == len(all_at_once) <= 3 * 16
    for a, b in zip(one, all_at_once):
        assert abs(a["score"] - b["score"]) <= 1e-5 and a["box"] == b["box"]
        assert (mask_of(a) != mask_of(b)).mean() <= 1e-3
        ys, xs = np.nonzero(mask_of(a))
        assert a["mask"]["size"] == [90, 120] and a["box"] == [xs.min(), ys.min(), xs.max(), ys.max()]
    assert [a["score"] for a in one] == sorted((a["score"] for a in one), reverse=True)
    attributes = {name: str(value) for name, value in WHOLE.items()}
    header = client.options_from_attributes(attributes, "X-Amzn-SageMaker-Custom-Attributes")
    assert header == WHOLE
    assert client.inference({"img": image, **header})[0] == all_at_once


def test_the_triton_model_refuses_a_grid_it_cannot_run(triton, model):
    segmenter = triton.segmenter(model)
    settings = np.array([contract.GRID_DEFAULTS[n] for n in contract.GRID_SETTINGS], dtype=np.float64)
    given = {
        contract.IMAGE: np.frombuffer(photo(), dtype=np.uint8),
        contract.POINTS: np.zeros((1, 2, 2), dtype=np.float32),
        contract.LABELS: np.array([[1, contract.NOT_A_POINT]]),
        contract.GRID: settings,
    }
    with pytest.raises(Refused, match="must be empty when grid is given"):
        run_request(segmenter, given)
    given[contract.POINTS], given[contract.LABELS] = np.zeros((0, 0, 2), np.float32), np.zeros((0, 0), np.int64)
    with pytest.raises(Refused, match="grid points_per_crop must be an integer from 1 to 64"):
        run_request(segmenter, {**given, contract.GRID: np.concatenate([[100.0], settings[1:]])})
    with pytest.raises(Refused, match="grid must hold 7 values"):
        run_request(segmenter, {**given, contract.GRID: settings[:3]})


def test_an_optional_input_left_out_is_read_as_empty_and_leaving_out_all_three_is_refused(repository, triton):
    """What a KServe v2 body may do: prompts without ``grid``, or a grid without ``input_points`` and
    ``input_labels`` (the config marks the three optional); each answer is that of the empty input."""
    from clients.v2_checks import ModelContract

    model = MODELS[0]
    config = ModelContract.from_pbtxt(model, (repository / model / "config.pbtxt").read_text())
    assert {name: spec.optional for name, spec in config.inputs.items()} == {
        contract.IMAGE: False,
        contract.POINTS: True,
        contract.LABELS: True,
        contract.GRID: True,
    }
    segmenter = triton.segmenter(model)
    image = np.frombuffer(photo(), dtype=np.uint8)
    prompts = {contract.POINTS: np.array([[[50, 40], [0, 0]]], np.float32), contract.LABELS: np.array([[1, -1]])}
    empty = np.zeros(0, np.float64)
    sent = run_request(segmenter, {contract.IMAGE: image, **prompts, contract.GRID: empty})
    left_out = run_request(segmenter, {contract.IMAGE: image, **prompts, contract.GRID: None})
    assert sent.keys() == left_out.keys() and all(np.array_equal(sent[k], left_out[k]) for k in sent)
    settings = np.array([{**contract.GRID_DEFAULTS, **WHOLE}[n] for n in contract.GRID_SETTINGS], np.float64)
    no_prompts = {contract.POINTS: np.zeros((0, 0, 2), np.float32), contract.LABELS: np.zeros((0, 0), np.int64)}
    sent = run_request(segmenter, {contract.IMAGE: image, **no_prompts, contract.GRID: settings})
    left_out = run_request(
        segmenter, {contract.IMAGE: image, contract.POINTS: None, contract.LABELS: None, contract.GRID: settings}
    )
    assert len(sent[contract.GRID_SCORES]) > 0
    assert sent.keys() == left_out.keys() and all(np.array_equal(sent[k], left_out[k]) for k in sent)
    nothing = {contract.IMAGE: image, contract.POINTS: None, contract.LABELS: None, contract.GRID: None}
    with pytest.raises(Refused, match="give input_points and input_labels .* or grid"):
        run_request(segmenter, nothing)


def test_many_prompts_run_the_decoder_a_bounded_number_at_a_time_each_answered_as_the_reference(
    client, reference, triton, model
):
    """A chain's detector may hand SAM hundreds of boxes: the decoder takes at most DECODER_ROWS of them
    a run (its memory grows with them), and each box's answer is still the reference's."""
    from app.triton.sam_model import DECODER_ROWS

    image = photo()
    count = 2 * DECODER_ROWS + 3
    boxes = [[3 * i, 2 * i, 3 * i + 60, 2 * i + 50] for i in range(count)]
    client.inference({"img": b64(image), "boxes": boxes[:1]})  # the segmenter opened
    segmenter = triton.segmenter(model)
    decoder = segmenter.decoder
    segmenter.decoder = Counted(decoder)
    try:
        answers, _ = client.inference({"img": b64(image), "boxes": boxes})
        assert segmenter.decoder.runs == 3
    finally:
        segmenter.decoder = decoder
    assert_answers(answers, reference.prompts(decoded(image), boxes=boxes, multimask=False), False)
