"""A family is configured, not coded: model.toml settings (input size, layout, channel order,
normalisation, dtype, resize/crop or letterbox, labels, defaults) drive the clients, and a model
that brings its own ONNX file is built by prepare_models without an export."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper
from PIL import Image
from tritonclient.grpc import model_config_pb2 as mc

from app.core.settings import Settings
from app.core.spec import SpecError
from clients import images
from clients.base import ModelClient
from clients.classification import ImageClassificationClient
from clients.families import FAMILIES, load_spec
from clients.vision import ImageClient
from scripts.model_prep import cli as prepare_models

TINY_TOML = """
family = "{family}"
max_batch_size = 4

[[inputs]]
name = "pixels"
dtype = "{dtype}"
dims = {dims}

[[outputs]]
name = "scores"
dtype = "FP32"
dims = {output_dims}

[export]
onnx = "model.onnx"

[preprocess]
{preprocess}

[postprocess]
labels = "labels.txt"
{postprocess}
"""


def write_model(
    root: Path,
    name: str = "tiny",
    family: str = "image_classification",
    dtype: str = "FP32",
    dims=(3, 160, 160),
    classes: int = 10,
    preprocess: str = "",
    postprocess: str = "",
    onnx_model: onnx.ModelProto | None = None,
) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    output_dims = [100, 5 + classes] if family == "detection" else [classes]
    (folder / "model.toml").write_text(
        TINY_TOML.format(
            family=family,
            dtype=dtype,
            dims=list(dims),
            output_dims=output_dims,
            preprocess=preprocess,
            postprocess=postprocess,
        )
    )
    (folder / "labels.txt").write_text("".join(f"thing {i}\n" for i in range(classes)))
    if onnx_model is not None:
        onnx.save(onnx_model, str(folder / "model.onnx"))
    return folder


def tiny_classifier(classes: int = 10, side: int = 160, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """[batch, 3, side, side] -> global average pool -> a 3 x classes matrix -> [batch, classes]."""
    weights = np.random.default_rng(0).normal(size=(3, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["pixels"], ["x"], to=TensorProto.FLOAT),
            helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["scores"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("pixels", dtype, ["batch", 3, side, side])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", classes])],
        [helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.flatten().tolist())],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def client_for(folder: Path):
    spec = load_spec(folder)
    return FAMILIES[spec.family].client.of(spec)(spec, triton=None, settings=Settings())


def photo(width: int = 300, height: int = 200) -> bytes:
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


# ---- the clients read their settings ---------------------------------------------------------------


def test_to_input_and_its_inverse():
    pixels = np.random.default_rng(2).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    lut = images.normalize_lut(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    for lut_ in (lut, None):
        for first in (True, False):
            for reverse in (True, False):
                tensor = images.to_input(pixels, lut_, first, reverse)
                assert tensor.shape == ((3, 7, 5) if first else (7, 5, 3))
                assert np.array_equal(images.from_input(tensor, lut_, first, reverse), pixels)
    assert np.array_equal(images.to_input(pixels, None, False, True), pixels[..., ::-1])


def test_scale_offset_nhwc_bgr_fp16(tmp_path):
    folder = write_model(
        tmp_path,
        dtype="FP16",
        dims=(160, 160, 3),
        preprocess="""
resize = 182
crop = 160
layout = "NHWC"
channels = "BGR"
scale = 0.00784313725490196
offset = -1.0
""",
        postprocess="topk = 4",
    )
    client = client_for(folder)
    arrays, _ = client.preprocess(photo(), "payload.img", {})
    tensor = arrays["pixels"]
    image = images.decode_image(photo(), "x", 10**8)
    fitted = np.asarray(images.center_crop(images.resize_short_side(image, 182), 160))
    expected = fitted[..., ::-1].astype(np.float64) / 127.5 - 1
    assert tensor.shape == (160, 160, 3)
    np.testing.assert_allclose(tensor, expected, atol=1e-6)
    assert client._stack([arrays])["pixels"].dtype == np.float16
    assert client.options["topk"].default == 4 and client.options["topk"].maximum == 10


def test_uint8_input_takes_the_pixels_and_letterbox_fits_the_whole_image(tmp_path):
    folder = write_model(tmp_path, dtype="UINT8", preprocess="letterbox = true\npad_color = [0, 0, 0]")
    client = client_for(folder)
    arrays, _ = client.preprocess(photo(300, 200), "payload.img", {})
    pixels = np.asarray(images.decode_image(photo(300, 200), "x", 10**8))
    expected, _, _ = images.letterbox(pixels, 160, (0, 0, 0))
    assert arrays["pixels"].dtype == np.uint8 and np.array_equal(arrays["pixels"], expected.transpose(2, 0, 1))
    assert arrays["pixels"][:, :26].max() == 0  # the black bands above and below a 3:2 image


def test_softmax_off_for_probability_outputs(tmp_path):
    folder = write_model(
        tmp_path, preprocess="mean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]", postprocess="softmax = false\ntopk = 2"
    )
    client = client_for(folder)
    scores = np.array([0.1, 0.6, 0.3] + [0.0] * 7, dtype=np.float32)
    result = client.postprocess({"scores": scores}, None, {"topk": 2})
    assert [(r["index"], r["label"]) for r in result] == [(1, "thing 1"), (2, "thing 2")]
    assert result[0]["score"] == pytest.approx(0.6)


def test_a_detector_of_another_size(tmp_path):
    folder = write_model(
        tmp_path,
        family="detection",
        dims=(3, 320, 320),
        classes=3,
        preprocess="pad_color = [0, 0, 0]",
        postprocess="conf_threshold = 0.5",
    )
    client = client_for(folder)
    arrays, context = client.preprocess(photo(300, 200), "payload.img", {})
    assert arrays["pixels"].shape == (3, 320, 320) and (context.width, context.height) == (300, 200)
    assert float(arrays["pixels"].max()) <= 1.0  # scale 1/255 by default
    assert client.options["conf_threshold"].default == 0.5 and len(client.labels) == 3


@pytest.mark.parametrize(
    "family, dtype, preprocess, message",
    [
        (
            "image_classification",
            "FP32",
            "scal = 0.1",
            r"\[preprocess\] scal is not a setting of the image_classification",
        ),
        ("image_classification", "FP32", "mean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]\nscale = 0.1", "not both"),
        ("image_classification", "FP32", "", "mean and std, or scale"),
        ("image_classification", "UINT8", "scale = 0.1", "UINT8 input takes the pixels as they are"),
        ("image_classification", "FP32", "scale = 0.1\nresize = 100", "do not fit the input"),
        ("image_classification", "FP32", "scale = 0.1\nletterbox = true\ncrop = 160", "resize and crop do not apply"),
        ("image_classification", "FP32", 'scale = 0.1\nlayout = "CHWN"', "layout must be one of"),
        (
            "image_classification",
            "FP32",
            "scale = 0.1\nletterbox = true\nfast_path = true",
            "fast_path applies to resize",
        ),
        ("image_classification", "FP32", 'scale = 0.1\nfast_path = "yes"', "fast_path must be true or false"),
        ("detection", "FP32", "size = 640", "size 640 does not fit the input"),
    ],
)
def test_bad_settings_stop_the_start_with_their_name(tmp_path, family, dtype, preprocess, message):
    folder = write_model(tmp_path, family=family, dtype=dtype, preprocess=preprocess)
    with pytest.raises(SpecError, match=message):
        client_for(folder)


def test_unknown_postprocess_key_is_refused(tmp_path):
    folder = write_model(tmp_path, preprocess="scale = 0.1", postprocess="top_k = 3")
    with pytest.raises(SpecError, match=r"\[postprocess\] top_k is not a setting.*settings: labels, max_topk"):
        client_for(folder)


def test_the_base_checks_the_keys_once_then_configures_then_bounds_the_options(tmp_path):
    folder = write_model(tmp_path, classes=7, preprocess="scale = 0.1", postprocess="topk = 4")
    calls = []

    class Counting(ImageClassificationClient):
        @classmethod
        def check_settings(cls, spec):
            calls.append("check_settings")
            super().check_settings(spec)

        def configure(self):
            calls.append("configure")
            super().configure()
            calls.append(f"configured: {len(self.labels)} labels, {self.width}px")

        def option_limits(self):
            calls.append("option_limits")
            return super().option_limits()

    client = Counting(load_spec(folder), triton=None, settings=Settings())
    assert calls == ["check_settings", "configure", "configured: 7 labels, 160px", "option_limits"]
    assert client.options["topk"].default == 4 and client.options["topk"].maximum == 7  # topk <= classes


def test_families_have_no_constructor_of_their_own():
    for cls in (ImageClient, *(family.client for family in FAMILIES.values())):
        assert "__init__" not in vars(cls), f"{cls.__name__} reads its settings in configure(), not __init__"
        assert cls.configure is not ModelClient.configure


# ---- prepare_models takes a user's ONNX file ------------------------------------------------------


@pytest.mark.parametrize("target", ["python", "onnxruntime"])
def test_prepare_models_takes_the_users_onnx(tmp_path, target, capsys):
    source = tmp_path / "src"
    write_model(source, preprocess="scale = 0.1", onnx_model=tiny_classifier())
    out = tmp_path / "repo"
    argv = ["--source", str(source), "--repository", str(out), "--models", "tiny", "--target", target]
    assert prepare_models.main(argv) == 0
    printed = capsys.readouterr().out
    assert "[tiny] checking" in printed and "ONNX Runtime at batch 2" in printed
    record = json.loads((out / "tiny" / "source.json").read_text())
    assert (record["weights"], record["onnx"], record["builder"], record["max_abs_diff"]) == (
        "file",
        "model.onnx",
        None,
        {},
    )
    assert (out / "tiny" / "1" / "model.onnx").read_bytes() == (source / "tiny" / "model.onnx").read_bytes()
    assert (out / "tiny" / "1" / "model.py").is_file() == (target == "python")
    assert (out / "tiny" / "labels.txt").is_file() and (out / "tiny" / "model.toml").is_file()
    config = text_format.Parse((out / "tiny" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.parameters["weights_source"].string_value == "file"
    assert [(i.name, list(i.dims)) for i in config.input] == [("pixels", [3, 160, 160])]
    client_for(out / "tiny")  # the router can serve what was written


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda f: (f / "model.toml").write_text(
                (f / "model.toml").read_text().replace("dims = [10]", "dims = [20]")
            ),
            r"does not match model.toml: output scores: dims differ at dim 1 \(graph has scores FP32 \[-1, 10\], model.toml says scores FP32 \[-1, 20\]",
        ),
        (
            lambda f: (f / "model.toml").write_text(
                (f / "model.toml").read_text().replace('dtype = "FP32"', 'dtype = "FP16"', 1)
            ),
            r"input pixels: dtype differs \(graph has pixels FP32",
        ),
        (lambda f: (f / "model.onnx").unlink(), r"model.onnx does not exist"),
        (lambda f: (f / "model.onnx").write_bytes(b"not onnx"), r"fails onnx.checker|cannot"),
        (lambda f: (f / "labels.txt").unlink(), r"labels.txt \(named in model.toml\) does not exist"),
    ],
)
def test_a_bad_onnx_file_is_refused_in_one_line(tmp_path, capsys, change, message):
    source = tmp_path / "src"
    folder = write_model(source, preprocess="scale = 0.1", onnx_model=tiny_classifier())
    change(folder)
    argv = ["--source", str(source), "--repository", str(tmp_path / "repo"), "--models", "tiny"]
    assert prepare_models.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("prepare_models: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_export_needs_a_builder_or_an_onnx_file(tmp_path, capsys):
    source = tmp_path / "src"
    folder = write_model(source, preprocess="scale = 0.1", onnx_model=tiny_classifier())
    toml = folder / "model.toml"
    toml.write_text(toml.read_text().replace('onnx = "model.onnx"', 'onnx = "model.onnx"\nbuilder = "yolov5s"'))
    assert prepare_models.main(["--source", str(source), "--repository", str(tmp_path / "r"), "--models", "tiny"]) == 1
    assert "needs either builder" in capsys.readouterr().err
