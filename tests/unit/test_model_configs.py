"""Every model, every target: config.pbtxt parses into Triton's ModelConfig and matches the ONNX graph."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from clients.families import find_specs
from scripts.model_prep import cli as prepare_models
from scripts.model_prep import detector_graph, triton_config
from scripts.model_prep.onnx_export import graph_tensors
from tests.support import TARGETS, build_repository

SOURCE = prepare_models.DEFAULT_SOURCE
MODELS = sorted(find_specs(SOURCE))


def _config(repository: Path, model: str) -> mc.ModelConfig:
    return triton_config.read_config(repository / model / "config.pbtxt")


def _as_graph(tensors) -> list[tuple[str, str, tuple[int, ...]]]:
    """Config tensors in the form graph_tensors gives: (name, dtype, [-1, *dims])."""
    return [(t.name, mc.DataType.Name(t.data_type).removeprefix("TYPE_"), (-1, *t.dims)) for t in tensors]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", MODELS)
def test_config_matches_onnx_graph(repositories, model, target):
    config = _config(repositories[target], model)
    graph_inputs, graph_outputs = graph_tensors(repositories["python"] / model / "1" / "model.onnx")

    assert config.name == model
    assert config.max_batch_size > 0
    assert _as_graph(config.input) == [(t.name, t.dtype, t.dims) for t in graph_inputs]
    assert _as_graph(config.output) == [(t.name, t.dtype, t.dims) for t in graph_outputs]
    assert all(t.dims[0] == -1 for t in graph_inputs + graph_outputs)  # batch dim dynamic


@pytest.mark.parametrize("model", MODELS)
def test_config_follows_the_spec(repositories, model):
    spec = find_specs(SOURCE)[model]
    for target in TARGETS:
        config = _config(repositories[target], model)
        assert config.max_batch_size == spec.max_batch_size
        assert config.dynamic_batching.max_queue_delay_microseconds == spec.max_queue_delay_microseconds
        # the shipped models leave their counts to serve's sizing: 1 written, "auto" marked
        assert spec.instance_count == spec.threads == 0
        assert [g.count for g in config.instance_group] == [1]
        marker = config.parameters["sizing"].string_value
        assert marker == ("instances" if target == "tensorrt" else "instances,threads"), target
        assert config.parameters["weights_source"].string_value == "small"  # the repositories conftest builds
        if target == "python":
            assert config.parameters["ort_intra_op_threads"].string_value == "0"
        # warmed up at load on one batch of the largest size, every input zeros of its dtype and dims
        (warmup,) = config.model_warmup
        assert warmup.batch_size == spec.max_batch_size and warmup.count == 1
        inputs, _ = detector_graph.served_tensors(spec)  # a detector's graph takes geometry and options too
        assert [t.name for t in config.input] == [t.name for t in inputs]
        assert sorted(warmup.inputs) == sorted(t.name for t in inputs)
        for tensor in inputs:
            given = warmup.inputs[tensor.name]
            assert given.zero_data and list(given.dims) == list(tensor.dims)
            assert given.data_type == mc.DataType.Value(f"TYPE_{tensor.dtype}")


@pytest.mark.parametrize(
    ("target", "backend", "platform", "kind", "files"),
    [
        ("python", "python", "", mc.ModelInstanceGroup.KIND_CPU, {"model.onnx", "model.py"}),
        ("onnxruntime", "", "onnxruntime_onnx", mc.ModelInstanceGroup.KIND_AUTO, {"model.onnx"}),
        ("tensorrt", "", "tensorrt_plan", mc.ModelInstanceGroup.KIND_GPU, set()),
    ],
)
def test_target_backend_and_artifacts(repositories, target, backend, platform, kind, files):
    for model in MODELS:
        config = _config(repositories[target], model)
        assert (config.backend, config.platform) == (backend, platform)
        assert config.instance_group[0].kind == kind
        assert {p.name for p in (repositories[target] / model / "1").iterdir()} == files


@pytest.mark.parametrize("model", MODELS)
def test_data_files_and_source_travel_with_the_model(repositories, model):
    folder = repositories["onnxruntime"] / model
    spec = find_specs(SOURCE)[model]
    settings = {**spec.preprocess, **spec.postprocess}
    for name in ["model.toml", *(settings[k] for k in ("labels", "vocab") if k in settings)]:
        assert (folder / name).read_bytes() == (SOURCE / model / name).read_bytes()
    source = json.loads((folder / "source.json").read_text())
    onnx_bytes = (folder / "1" / "model.onnx").read_bytes()
    assert source["weights"] == "small" and source["seed"] == 0
    assert source["onnx_sha256"] == hashlib.sha256(onnx_bytes).hexdigest()
    assert all(source["max_abs_diff"][n] <= source["tolerance"][n] for n in source["max_abs_diff"])


def test_data_files_hold_the_real_vocabulary_and_labels(repositories):
    vocab = (repositories["python"] / "bert_base" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    labels = (repositories["python"] / "resnet" / "labels.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == 30522 and vocab[2116] == "many" and vocab[103] == "[MASK]"
    assert len(labels) == 1000 and labels[0] == "tench" and labels[999] == "toilet tissue"


def test_tuning_options_reach_the_config(tmp_path):
    build_repository(
        tmp_path,
        "python",
        "--models",
        "resnet",
        "yolov5",
        "--config-only",
        "--max-batch-size",
        "4",
        "--max-batch-size",
        "resnet=16",
        "--max-queue-delay-us",
        "500",
        "--instance-count",
        "yolov5=3",
        "--ort-threads",
        "1",
    )
    resnet, yolov5 = _config(tmp_path, "resnet"), _config(tmp_path, "yolov5")
    assert (resnet.max_batch_size, yolov5.max_batch_size) == (16, 4)
    assert resnet.dynamic_batching.max_queue_delay_microseconds == 500
    assert (resnet.instance_group[0].count, yolov5.instance_group[0].count) == (1, 3)
    assert resnet.parameters["ort_intra_op_threads"].string_value == "1"
    # what was given is no longer "auto": serve's sizing keeps it
    assert (resnet.parameters["sizing"].string_value, yolov5.parameters["sizing"].string_value) == ("instances", "")
    assert not (tmp_path / "bert_base").exists()
