"""The zero-shot detectors' export check (``scripts.model_prep.zsd_check``) on the "zsd" small-model
set's tiny OWLv2, OWL-ViT and Grounding DINO and their graphs: a correct graph passes; a graph whose
weights are off by a thousandth is refused; Grounding DINO's graph made to select other proposals from
the same scores is refused unless the places are near-ties, and where they are, torch is run again with the graph's
selection and must agree at the tolerance; torch's own spread raises a limit only where it is larger."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.core import zsd_contract as contract
from clients.families import load_spec
from scripts.model_prep import zsd_check, zsd_export
from scripts.model_prep.onnx_export import ExportError
from scripts.model_prep.small_models.sets import Built
from tests.graph_edits import perturb, rewritten


@pytest.fixture(scope="module", params=("owlv2_tiny", "owlvit_tiny", "gdino_tiny"))
def detector(request, small_models: Built):
    return loaded(small_models, request.param)


@pytest.fixture(scope="module")
def grounding(small_models: Built):
    return loaded(small_models, "gdino_tiny")


def loaded(small_models: Built, name: str):
    """(spec, model, processor, graph) of a tiny detector, as the export checks them."""
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    folder = small_models.models("zsd") / name / "hf"
    model = AutoModelForZeroShotObjectDetection.from_pretrained(str(folder)).eval()
    repository = small_models.repository("zsd") / name
    return (
        load_spec(repository),
        model,
        AutoProcessor.from_pretrained(str(folder)),
        repository / "1" / contract.GRAPH_FILE,
    )


def check(spec, model, processor, graph: Path):
    return zsd_export.check(spec, model, processor, graph, seed=0)


def select_the_lowest(proto) -> None:
    """The two-stage TopK made to select the proposals of the lowest scores: a graph that selects other
    proposals than torch from the same scores."""
    from onnx import helper

    (topk,) = [node for node in proto.graph.node if node.op_type == "TopK"]
    kept = [attribute for attribute in topk.attribute if attribute.name != "largest"]
    topk.ClearField("attribute")
    topk.attribute.extend([*kept, helper.make_attribute("largest", 0)])


def test_a_correct_graph_passes(detector):
    spec, *_ = detector
    diffs, limits = check(*detector)
    assert all(diffs[name] <= limits[name] for name in diffs)
    assert (zsd_check.SCORES in diffs) == (spec.text.model_type == contract.GROUNDING_DINO)


def test_a_graph_off_by_a_thousandth_of_its_weights_is_refused(detector, tmp_path: Path):
    spec, model, processor, graph = detector
    wrong = rewritten(graph, tmp_path / contract.GRAPH_FILE, perturb)
    with pytest.raises(ExportError, match="ONNX Runtime differs from torch beyond the tolerance"):
        check(spec, model, processor, wrong)


def test_a_selection_beyond_a_near_tie_is_refused(grounding, tmp_path: Path):
    spec, model, processor, graph = grounding
    other = rewritten(graph, tmp_path / contract.GRAPH_FILE, select_the_lowest)
    with pytest.raises(
        ExportError, match="two-stage selection differs from torch's at 30 of 30 places, not only among"
    ):
        check(spec, model, processor, other)


def test_a_near_tied_selection_is_checked_with_torch_on_the_same_selection(grounding, tmp_path, monkeypatch, capsys):
    """With the near-tie window opened wide, the other graph's selection counts as near-ties: torch
    forced to the same selection agrees with it at the tolerance (and the places are printed)."""
    spec, model, processor, graph = grounding
    other = rewritten(graph, tmp_path / contract.GRAPH_FILE, select_the_lowest)
    monkeypatch.setattr(zsd_check, "TIE_FACTOR", 1e12)
    diffs, limits = check(spec, model, processor, other)
    assert all(diffs[name] <= limits[name] for name in diffs)
    assert "swapped 180 near-tied proposals" in capsys.readouterr().out  # 30 places, 3 images x 2 prompts


def test_near_ties_counts_the_places_within_the_drift():
    scores = np.array([[5.0, 4.0, 3.0000, 2.99999, 1.0]])
    drifted = scores + np.array([[0, 0, -1e-5, 1e-5, 0]])  # the runtimes disagree by 1e-5
    chosen = np.array([[0, 1, 2, 3]])
    assert zsd_check.near_ties(scores, drifted, chosen, np.array([[0, 1, 3, 2]])) == 2
    with pytest.raises(ExportError, match="at 2 of 4 places, not only among near-ties: at 1 proposal 2 for 1"):
        zsd_check.near_ties(scores, drifted, chosen, np.array([[0, 2, 1, 3]]))
    with pytest.raises(ExportError, match="at 1 of 4 places"):  # the fourth place taken by one past the top 4
        zsd_check.near_ties(scores, drifted, chosen, np.array([[0, 1, 2, 4]]))


def test_torch_s_own_spread_raises_a_limit_only_where_it_is_larger():
    limits = {contract.LOGITS: 1e-4, contract.PRED_BOXES: 1e-4}
    zsd_check.widen("m", limits, {contract.LOGITS: 1e-7, contract.PRED_BOXES: 1e-3}, 0)
    assert limits == {contract.LOGITS: 1e-4, contract.PRED_BOXES: zsd_check.SPREAD_FACTOR * 1e-3}
