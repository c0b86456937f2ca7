"""The YOLOv5s v7.0 architecture: official size, state_dict names and output layout."""

from __future__ import annotations

import torch

from scripts.model_prep.yolov5s import ANCHORS, STRIDES, DetectionModel


def test_matches_the_official_model_summary():
    model = DetectionModel()
    state = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == 7_235_389  # "yolov5s summary: 7235389 parameters"
    assert state["model.0.conv.weight"].shape == (32, 3, 6, 6)
    assert state["model.24.m.2.weight"].shape == (255, 512, 1, 1)
    assert state["model.24.anchors"].shape == (3, 3, 2)
    expected = torch.tensor(ANCHORS, dtype=torch.float32).view(3, 3, 2) / torch.tensor(STRIDES).view(3, 1, 1)
    assert torch.equal(state["model.24.anchors"], expected)


def test_output_is_boxes_in_pixels_and_probabilities():
    torch.manual_seed(0)
    with torch.no_grad():
        out = DetectionModel().eval()(torch.rand(1, 3, 640, 640))
    assert out.shape == (1, 25200, 85)
    assert float(out[..., 4:].min()) >= 0 and float(out[..., 4:].max()) <= 1
    # first anchor of the first stride-8 cell: x = (2 * sigmoid - 0.5) * 8, w = (2 * sigmoid) ** 2 * 10
    assert -4 <= float(out[0, 0, 0]) <= 12
    assert 0 <= float(out[0, 0, 2]) <= 4 * ANCHORS[0][0]


def _as_official(model: DetectionModel, monkeypatch) -> None:
    """Re-home the model's classes under the official package names (models.common, models.yolo)."""
    import sys
    import types

    from scripts.model_prep import yolov5s

    packages = {name: types.ModuleType(name) for name in ("models", "models.common", "models.yolo")}
    for name, package in packages.items():
        monkeypatch.setitem(sys.modules, name, package)
    for module in model.modules():
        cls = type(module)
        if cls.__module__ == yolov5s.__name__:
            home = "models.yolo" if cls.__name__ in ("DetectionModel", "Detect") else "models.common"
            official = getattr(packages[home], cls.__name__, None) or type(cls.__name__, (cls,), {"__module__": home})
            setattr(packages[home], cls.__name__, official)
            module.__class__ = official


def test_an_official_checkpoint_loads_without_the_yolov5_package(tmp_path, monkeypatch):
    from scripts.model_prep import recipes

    torch.manual_seed(1)
    original = DetectionModel().eval()
    expected = {k: v.clone() for k, v in original.state_dict().items()}
    with monkeypatch.context() as patch:
        _as_official(original, patch)
        torch.save({"epoch": -1, "model": original.half(), "ema": None, "optimizer": None}, tmp_path / "yolov5s.pt")

    loaded = recipes.recipes()["yolov5s"].from_file(None, tmp_path / "yolov5s.pt")

    state = loaded.state_dict()
    assert type(loaded) is DetectionModel and state.keys() == expected.keys()
    assert all(torch.allclose(state[k].float(), expected[k].float().half().float()) for k in expected)


def test_a_plain_state_dict_loads(tmp_path):
    from scripts.model_prep import recipes

    torch.manual_seed(2)
    original = DetectionModel()
    torch.save(original.state_dict(), tmp_path / "state.pt")
    loaded = recipes.recipes()["yolov5s"].from_file(None, tmp_path / "state.pt")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in original.state_dict().items())
