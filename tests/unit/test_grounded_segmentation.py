"""The grounded_segmentation family against the two references run one after the other: the detector's
(``tests/zsd_reference.py``: its processor, the model, ``post_process_grounded_object_detection``),
then SAM's (``tests/sam_reference.py``) with the detector's boxes as ``input_boxes``. In process: the
router's client with the chain's Triton model (``app/triton/grounded_model.py``'s ``Chain``) standing in
for Triton, on a repository built here from the "zsd" and "sam" small-model sets (the tiny Grounding
DINO, the tiny OWLv2, the tiny SAM and the tiny SAM-HQ, each as its own preparation wrote it) and
chains naming them (Grounding DINO then SAM-HQ: against SAM-HQ's reference).
Also: the image decoded once and SAM's image encoder run once per image, however many boxes; the
refusals at start (a missing model, one of another family), each one line naming the chain's
model.toml; the bad inputs, each a 400 naming its field.
Tolerances: the references' (labels exact, scores 1e-4, boxes 0.05 pixel; masks: at most 0.1 % of the
pixels differ, each where the reference's logit is within 1e-4 of the threshold)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.core import grounded_contract as contract
from app.core.errors import InvalidInput
from app.core.settings import Settings
from app.core.spec import SpecError
from app.triton import grounded_model
from clients import images
from clients.families import load_spec, make_client
from scripts.model_prep.small_models.sets import Built
from tests.grounded_reference import check_against_references
from tests.sam_reference import SamReference
from tests.support import b64, block_photo
from tests.zsd_reference import ZsdReference

LABELS = ["a cat", "a remote control"]
PARTS = {
    "gdino": ("zsd", "gdino_tiny"),
    "owl": ("zsd", "owlv2_tiny"),
    "sam": ("sam", "sam_tiny"),
    "samhq": ("sam", "samhq_tiny"),
}
CHAINS = {"chain": ("gdino", "sam"), "owl_chain": ("owl", "sam"), "hq_chain": ("gdino", "samhq")}


def chain_toml(detector: str, segmenter: str = "sam") -> str:
    return f'family = "grounded_segmentation"\ndetector = "{detector}"\nsegmenter = "{segmenter}"\n'


def photo(width: int = 150, height: int = 100, seed: int = 0) -> bytes:
    return block_photo(width, height, seed)


class ChainTriton:
    """A stand-in for Triton: each chain's Triton model over the repository's graphs, the calls counted."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.chains: dict[str, grounded_model.Chain] = {}

    def infer(self, model, inputs, output_names, version=None):
        if model not in self.chains:
            self.chains[model] = grounded_model.open_chain(self.repository / model, {}, 1_000_000)
        found = self.chains[model].run(
            inputs[contract.IMAGE].tobytes(),
            inputs[contract.INPUT_IDS],
            inputs[contract.ATTENTION_MASK],
            float(inputs[contract.THRESHOLD][0]),
        )
        return found, "1"


@pytest.fixture(scope="module")
def repository(small_models: Built, tmp_path_factory) -> Path:
    """A repository of the detectors, SAM (as their preparation wrote them) and two chains."""
    folder = tmp_path_factory.mktemp("grounded")
    for name, (set_name, model) in PARTS.items():
        shutil.copytree(small_models.repository(set_name) / model, folder / name)
    for name, (detector, segmenter) in CHAINS.items():
        (folder / name).mkdir()
        (folder / name / "model.toml").write_text(chain_toml(detector, segmenter))
    return folder


@pytest.fixture(scope="module")
def triton(repository: Path) -> ChainTriton:
    return ChainTriton(repository)


@pytest.fixture(scope="module")
def references(small_models: Built) -> dict:
    return {
        "gdino": ZsdReference(small_models.models("zsd") / "gdino_tiny" / "hf"),
        "owl": ZsdReference(small_models.models("zsd") / "owlv2_tiny" / "hf"),
        "sam": SamReference(small_models.models("sam") / "sam_tiny" / "hf"),
        "samhq": SamReference(small_models.models("sam") / "samhq_tiny" / "hf"),
    }


def client_of(repository: Path, triton: ChainTriton, name: str = "chain"):
    return make_client(load_spec(repository / name), triton, Settings.from_env())


@pytest.mark.parametrize("threshold", [0.6, 0.65])
def test_grounding_dino_labels_then_sam_equal_the_references(repository, triton, references, threshold):
    data = photo()
    answer, _ = client_of(repository, triton).inference({"img": b64(data), "labels": LABELS, "threshold": threshold})
    check_against_references(answer, references, "gdino", data, LABELS, threshold=threshold)


def test_a_prompt_text_threshold_and_mask_threshold_equal_the_references(repository, triton, references):
    data = photo(120, 160, seed=2)
    payload = {
        "img": b64(data),
        "text": "a cat. a dog.",
        "threshold": 0.6,
        "text_threshold": 0.5,
        "mask_threshold": 0.3,
    }
    answer, _ = client_of(repository, triton).inference(payload)
    check_against_references(
        answer, references, "gdino", data, "a cat. a dog.", threshold=0.6, text_threshold=0.5, mask_threshold=0.3
    )


def test_a_sam_hq_segmenter_chains_too(repository, triton, references):
    data = photo(130, 110, seed=3)
    answer, _ = client_of(repository, triton, "hq_chain").inference(
        {"img": b64(data), "labels": LABELS, "threshold": 0.6}
    )
    check_against_references(answer, references, "gdino", data, LABELS, segmenter="samhq", threshold=0.6)


def test_an_owl_detector_chains_too(repository, triton, references):
    data = photo(140, 90, seed=1)
    answer, _ = client_of(repository, triton, "owl_chain").inference({"img": b64(data), "labels": LABELS})
    check_against_references(answer, references, "owl", data, LABELS, threshold=0.1)


def test_the_image_is_decoded_once_and_embedded_once_however_many_boxes(repository, triton, monkeypatch):
    client = client_of(repository, triton)
    client.inference({"img": b64(photo()), "labels": LABELS, "threshold": 0.9})  # the chain opened
    chain = triton.chains["chain"]
    counts = {"decoded": 0, "embedded": 0}
    decode, embed = images.decode_item, chain.segmenter.embed

    def counted(key, step):
        def run(*args, **kwargs):
            counts[key] += 1
            return step(*args, **kwargs)

        return run

    monkeypatch.setattr(images, "decode_item", counted("decoded", decode))
    monkeypatch.setattr(chain.segmenter, "embed", counted("embedded", embed))
    answer, _ = client.inference({"img": b64(photo()), "labels": LABELS, "threshold": 0.6})
    assert len(answer) > 1
    assert counts == {"decoded": 1, "embedded": 1}


def test_no_detection_is_an_empty_answer(repository, triton):
    answer, _ = client_of(repository, triton).inference({"img": b64(photo()), "labels": LABELS, "threshold": 1.0})
    assert answer == []


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        (chain_toml("nowhere"), "detector = 'nowhere': no model of that name"),
        (chain_toml("sam"), "detector = 'sam' is a 'mask_generation' model"),
        (chain_toml("gdino", "gdino"), "segmenter = 'gdino' is a 'zero_shot_object_detection' model"),
        (chain_toml("chain"), "detector = 'chain' is a 'grounded_segmentation' model"),
        (chain_toml("gdino") + "threshold = 0.3\n", "'threshold' is not a key"),
    ],
)
def test_a_chain_naming_what_it_cannot_chain_is_refused_at_start(repository, tmp_path, toml, says):
    for name in ("gdino", "sam"):
        (tmp_path / name).symlink_to(repository / name)
    (tmp_path / "chain").mkdir()
    (tmp_path / "chain" / "model.toml").write_text(toml)
    with pytest.raises(SpecError) as refused:
        load_spec(tmp_path / "chain")
    message = str(refused.value)
    assert message.startswith(str(tmp_path / "chain" / "model.toml")) and says in message and "\n" not in message


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({}, "payload.labels"),
        ({"labels": []}, "payload.labels"),
        ({"labels": LABELS, "text": "a cat."}, "payload.labels"),
        ({"labels": LABELS, "mask_threshold": 5000}, "payload.mask_threshold"),
        ({"labels": LABELS, "threshold": 2}, "payload.threshold"),
        ({"labels": LABELS, "multimask_output": True}, "payload.multimask_output"),
        ({"labels": ["a.b"]}, "payload.labels[0]"),
    ],
)
def test_bad_inputs_are_refused_naming_the_field(repository, triton, payload, named):
    with pytest.raises(InvalidInput) as refused:
        client_of(repository, triton).inference({"img": b64(photo()), **payload})
    assert named in refused.value.message


def test_an_image_that_does_not_decode_is_refused_naming_it(repository, triton):
    with pytest.raises(InvalidInput) as refused:
        client_of(repository, triton).inference({"img": b64(b"not an image"), "labels": LABELS})
    assert "payload.img" in refused.value.message
