"""The mask_generation family's export (``scripts.model_prep.sam_export``, ``sam_graphs``) on the "sam"
small-model set's tiny SAM and SAM-HQ and their prepared graphs: each graph takes and gives what the
contract says for its model type (SAM-HQ's encoder also gives the intermediate embeddings, which its
decoder takes); the check passes them against the PyTorch model as a caller runs it (single and
multimask, boxes and points: SAM-HQ's tokens 1 to 3 sorted, each with the HQ token's mask); a graph
whose weights are off by a thousandth is refused in one line; a SAM-HQ config without the global
layer its decoder reads is refused naming it; spec completion tells the two from config.json and
refuses another model type."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.core import mask_contract as contract
from app.core.text_spec import TextSpecError
from clients.families import load_spec
from clients.mask_generation import complete
from scripts.model_prep import sam_export, weights
from scripts.model_prep.onnx_export import ExportError
from scripts.model_prep.small_models.sets import Built
from tests.graph_edits import perturb, rewritten

MODELS = {"sam_tiny": contract.SAM, "samhq_tiny": contract.SAM_HQ}


@pytest.fixture(scope="module", params=tuple(MODELS))
def exported(request, small_models: Built):
    """(spec, model, processor, the folder of its graphs) of a tiny model, as the export checks them."""
    from transformers import AutoModel, AutoProcessor

    folder = small_models.models("sam") / request.param / "hf"
    repository = small_models.repository("sam") / request.param
    return (
        load_spec(repository),
        AutoModel.from_pretrained(str(folder)).eval(),
        AutoProcessor.from_pretrained(str(folder)),
        repository / "1",
    )


def check(spec, model, processor, folder: Path):
    return sam_export.check(spec, model, processor, folder, sam_export.check_image(0))


def test_the_graphs_take_and_give_the_contracts_tensors_of_their_model_type(exported):
    import onnx

    spec, _, _, folder = exported
    assert spec.text.model_type == MODELS[spec.name]
    encoded = contract.ENCODER_OUTPUTS[spec.text.model_type]
    encoder, decoder = (onnx.load(str(folder / name)).graph for name in contract.ONNX_FILES)
    assert [o.name for o in encoder.output] == list(encoded)
    assert [i.name for i in decoder.input] == [*encoded, contract.POINTS, contract.LABELS]
    assert [o.name for o in decoder.output] == [contract.IOU_SCORES, contract.PRED_MASKS]


def test_the_check_passes_the_graphs_against_the_model(exported):
    spec, *_ = exported
    diffs, limits = check(*exported)
    assert all(diffs[name] <= limits[name] for name in diffs)
    checked = {name for name in diffs if name.startswith("decoder")}
    assert len(checked) == 12  # boxes, 1 point, 2 points; single and multimask; scores and masks
    assert ("encoder intermediate_embeddings" in diffs) == (spec.text.model_type == contract.SAM_HQ)


def test_a_graph_off_by_a_thousandth_of_its_weights_is_refused(exported, tmp_path: Path):
    spec, model, processor, folder = exported
    for name in contract.ONNX_FILES:
        shutil.copyfile(folder / name, tmp_path / name)
    rewritten(folder / contract.DECODER_FILE, tmp_path / contract.DECODER_FILE, perturb)
    with pytest.raises(ExportError, match=f"\\[{spec.name}\\] ONNX Runtime differs from torch beyond the tolerance"):
        check(spec, model, processor, tmp_path)


def copied_folder(small_models: Built, tmp_path: Path, change) -> Path:
    """The tiny SAM-HQ's model folder copied, its config.json changed by ``change``."""
    folder = tmp_path / "samhq"
    shutil.copytree(small_models.models("sam") / "samhq_tiny", folder)
    config = json.loads((folder / "hf" / "config.json").read_text())
    change(config)
    (folder / "hf" / "config.json").write_text(json.dumps(config))
    return folder


def test_a_sam_hq_without_the_global_layer_its_decoder_reads_is_refused(small_models: Built, tmp_path: Path):
    folder = copied_folder(small_models, tmp_path, lambda c: c["vision_config"].update(global_attn_indexes=[]))
    choice = weights.WeightsChoice(weights.RANDOM, 0)
    with pytest.raises(ExportError, match="global_attn_indexes is empty: SAM-HQ's mask decoder reads"):
        sam_export.load_model(load_spec(folder), choice)


def test_completion_tells_sam_hq_from_its_config_and_refuses_another_model(small_models: Built, tmp_path: Path):
    raw = {"family": "mask_generation", "export": {"transformers": "hf"}}
    _, text = complete(raw, small_models.models("sam") / "samhq_tiny", "model.toml")
    assert text.model_type == contract.SAM_HQ
    folder = copied_folder(small_models, tmp_path, lambda c: c.update(model_type="sam2"))
    with pytest.raises(TextSpecError, match="serves SAM and SAM-HQ .*; this is a 'sam2' model"):
        complete(raw, folder, "model.toml")
