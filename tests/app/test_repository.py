"""The app built from a model repository: the default registry, a fourth model configured (not
coded), and specs that stop the start."""

from __future__ import annotations

import json
import shutil

import pytest

from app.core.settings import Settings
from app.router import create_app
from tests.support import b64, solid_image


def test_default_settings_build_from_the_repository(repository, triton):
    app = create_app(Settings(model_repository=repository), triton=triton)
    assert sorted(app.extensions["registry"]) == ["bert_base", "resnet", "yolov5"]
    assert json.loads(app.test_client().get("/ping").get_data())["status"] == "healthy"


TINY_SPEC = """
family = "image_classification"
max_batch_size = 4

[[inputs]]
name = "pixels"
dtype = "FP32"
dims = [3, 160, 160]

[[outputs]]
name = "scores"
dtype = "FP32"
dims = [10]

[preprocess]
resize = 182
crop = 160
scale = 0.00784313725490196  # 1/127.5
offset = -1.0

[postprocess]
labels = "labels.txt"
topk = 2
"""


@pytest.mark.parametrize("pipeline", [None, "router"])
def test_a_fourth_model_is_configured_not_coded(tmp_path, fake_triton_class, pipeline):
    """Added by configuration alone: on the Triton pipeline by default (the router sends the
    image's bytes to ``tiny_pipeline``), or the router's when model.toml says so; the network
    gets the same tensor either way."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "model.toml").write_text(TINY_SPEC if pipeline is None else f'pipeline = "{pipeline}"\n{TINY_SPEC}')
    (folder / "labels.txt").write_text("".join(f"thing {i}\n" for i in range(10)))
    fake = fake_triton_class(tmp_path)
    seen = []
    network = fake._image_classification

    def classify(spec, inputs, batch):
        seen.append(inputs["pixels"])
        return network(spec, inputs, batch)

    fake._image_classification = classify
    app = create_app(Settings(model_repository=tmp_path), triton=fake)
    data = solid_image(400, 300, (255, 0, 128))
    response = app.test_client().post("/invocations", json={"modelname": "tiny", "payload": {"img": b64(data)}})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(response.get_json()["result"]) == 2
    model, shapes, _ = fake.calls[0]
    if pipeline is None:
        assert (model, shapes) == ("tiny_pipeline", {"image": (1, len(data)), "image_length": (1, 1)})
    else:
        assert (model, shapes) == ("tiny", {"pixels": (1, 3, 160, 160)})
    assert seen[0].shape == (1, 3, 160, 160)
    assert seen[0][0, :, 80, 80].tolist() == pytest.approx([1.0, -1.0, 128 / 127.5 - 1], abs=1e-6)


def test_bad_specs_stop_the_start(tmp_path, repository, fake_triton_class):
    from app.core.spec import SpecError

    for name in ("yolov5", "resnet", "bert_base"):
        shutil.copytree(repository / name, tmp_path / name)
    toml = tmp_path / "yolov5" / "model.toml"
    toml.write_text(toml.read_text().replace("conf_threshold = 0.25", "conf_threshold = 2"))
    with pytest.raises(SpecError, match=r"conf_threshold must be between 0 and 1"):
        create_app(Settings(model_repository=tmp_path), triton=fake_triton_class(repository))
    toml.write_text(toml.read_text().replace('family = "detection"', 'family = "segmentation"'))
    with pytest.raises(SpecError, match="segmentation"):
        create_app(Settings(model_repository=tmp_path), triton=fake_triton_class(repository))
    (tmp_path / "yolov5").rename(tmp_path / "unused")
    (tmp_path / "resnet" / "labels.txt").write_text("just one\n")
    with pytest.raises(SpecError, match="1 labels for at least 1000 classes"):
        create_app(Settings(model_repository=tmp_path), triton=fake_triton_class(repository))
