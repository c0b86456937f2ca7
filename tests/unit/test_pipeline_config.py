"""The image pipelines' repositories for every target (tensorrt with ``--config-only``, no GPU):
every ``config.pbtxt`` parses as Triton's ModelConfig, and each ensemble's wiring holds step to
step: every tensor a step takes is an ensemble input or an earlier step's output of the same
dtype and dims, every required input is fed, and the ensemble's outputs are produced as declared.
A detector's pipeline is preprocess -> the network with its postprocessing in the graph: no
python postprocessing step, for any target."""

from __future__ import annotations

import shutil

import pytest

from app.core.pipeline import ensemble_model, postprocess_model, preprocess_model
from scripts.model_prep import triton_config
from tests.support import IMAGE_MODELS, TARGETS, wiring_problems


@pytest.mark.parametrize("target", TARGETS)
def test_every_config_parses_as_model_config(repositories, target):
    folders = sorted(p.parent for p in repositories[target].glob("*/config.pbtxt"))
    names = {folder.name for folder in folders}
    for model in IMAGE_MODELS:
        expected = {model, preprocess_model(model), ensemble_model(model)}
        assert expected <= names, (target, sorted(names))
    assert postprocess_model("yolov5") not in names and postprocess_model("resnet") not in names
    for folder in folders:
        config = triton_config.read_config(folder / "config.pbtxt")
        assert config.name == folder.name
        assert (folder / "1").is_dir()  # an ensemble's version folder too: Triton needs it
        if config.platform == "ensemble":  # kept by a file, through copies that drop empty folders
            assert [p.name for p in (folder / "1").iterdir()] == ["ENSEMBLE.txt"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", IMAGE_MODELS)
def test_the_ensemble_wiring_agrees_step_to_step(repositories, target, model):
    repository = repositories[target]
    assert wiring_problems(repository, ensemble_model(model)) == []
    preprocess = triton_config.read_config(repository / preprocess_model(model) / "config.pbtxt")
    if target == "tensorrt":  # decoding and resizing on the GPU: DALI, its pipeline file beside it
        assert preprocess.backend == "dali"
        assert (repository / preprocess_model(model) / "1" / "dali.py").is_file()
        assert not (repository / preprocess_model(model) / "1" / "model.py").exists()
    else:
        assert preprocess.backend == "python"
        assert (repository / preprocess_model(model) / "1" / "model.py").is_file()
    steps = triton_config.read_config(repository / ensemble_model(model) / "config.pbtxt").ensemble_scheduling.step
    assert [step.model_name for step in steps] == [preprocess_model(model), model]
    if model == "yolov5":  # the network's step answers the detections: NMS and box scaling are in its graph
        assert sorted(steps[1].output_map) == ["detections", "num_detections"]
        assert sorted(steps[1].input_map) == sorted(
            ["images", "image_size", "letterbox", "conf_threshold", "iou_threshold", "max_detections"]
        )


def test_a_broken_wiring_is_found(repositories, tmp_path):
    """The check above can fail: the network's input made another size, a step's input renamed."""
    repository = tmp_path / "repository"
    shutil.copytree(repositories["python"], repository)
    network = repository / "yolov5" / "config.pbtxt"
    network.write_text(network.read_text().replace("dims: 640", "dims: 320"))
    problems = wiring_problems(repository, ensemble_model("yolov5"))
    assert any("images" in problem and "320" in problem for problem in problems), problems
    network.write_text(network.read_text().replace('name: "letterbox"', 'name: "letterbox_gain"'))
    problems = wiring_problems(repository, ensemble_model("yolov5"))
    assert any("'letterbox', which is not one of its inputs" in problem for problem in problems), problems
    assert any("'letterbox_gain' is not fed" in problem for problem in problems), problems
