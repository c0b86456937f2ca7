"""serve refuses TensorRT plans built for another GPU type (app/serve/engines.py), with fake GPU info."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.serve import engines
from app.serve.engines import EngineMismatch, GpuInfo, check_engines, parse_nvidia_smi, write_record

T4 = GpuInfo("Tesla T4", "7.5")
A10G = GpuInfo("NVIDIA A10G", "8.6")
A10 = GpuInfo("NVIDIA A10", "8.6")


def make_plan(repository: Path, model: str = "resnet", built_on: GpuInfo | None = T4) -> Path:
    version = repository / model / "1"
    version.mkdir(parents=True)
    (repository / model / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    plan = version / "model.plan"
    plan.write_bytes(b"not a real engine")
    if built_on is not None:
        write_record(plan, built_on, "10.8.0")
    return plan


def never_called():
    raise AssertionError("no plan: the GPU must not even be looked for")


def test_no_plan_means_nothing_to_check(tmp_path):
    (tmp_path / "resnet" / "1").mkdir(parents=True)
    (tmp_path / "resnet" / "1" / "model.onnx").write_bytes(b"onnx")
    check_engines(tmp_path, detect=never_called)


def test_no_gpu_means_nothing_to_check(tmp_path, caplog):
    make_plan(tmp_path)
    with caplog.at_level(logging.WARNING, logger="serve.engines"):
        check_engines(tmp_path, detect=list)
    assert "no GPU visible" in caplog.text


def test_same_gpu_passes(tmp_path):
    make_plan(tmp_path, built_on=T4)
    check_engines(tmp_path, detect=lambda: [T4])


def test_plan_from_another_gpu_type_is_refused_with_a_clear_message(tmp_path):
    make_plan(tmp_path, "resnet", built_on=T4)
    make_plan(tmp_path, "yolov5", built_on=A10G)
    with pytest.raises(EngineMismatch) as refused:
        check_engines(tmp_path, detect=lambda: [A10G])
    message = str(refused.value)
    assert "resnet/1/model.plan was built on Tesla T4 (compute capability 7.5)" in message
    assert "this GPU is NVIDIA A10G (8.6)" in message
    assert "yolov5" not in message
    assert "--target tensorrt" in message
    assert isinstance(refused.value, ValueError)  # serve's main() turns it into "cannot start", exit 2


def test_same_compute_capability_other_name_only_warns(tmp_path, caplog):
    make_plan(tmp_path, built_on=A10G)
    with caplog.at_level(logging.WARNING, logger="serve.engines"):
        check_engines(tmp_path, detect=lambda: [A10])
    assert "same compute capability 8.6" in caplog.text


def test_plan_without_record_only_warns(tmp_path, caplog):
    make_plan(tmp_path, built_on=None)
    with caplog.at_level(logging.WARNING, logger="serve.engines"):
        check_engines(tmp_path, detect=lambda: [T4])
    assert "cannot check" in caplog.text


def test_every_visible_gpu_is_compared(tmp_path):
    make_plan(tmp_path, built_on=T4)
    with pytest.raises(EngineMismatch):
        check_engines(tmp_path, detect=lambda: [T4, A10G])


def test_record_round_trip(tmp_path):
    plan = make_plan(tmp_path, built_on=A10G)
    assert engines.record_path(plan).name == "model.plan.gpu.json"
    assert engines.read_record(plan) == A10G


def test_parse_nvidia_smi():
    text = "Tesla T4, 7.5\nNVIDIA A10G, 8.6\n\n"
    assert parse_nvidia_smi(text) == [T4, A10G]


def test_detect_gpus_on_this_machine_does_not_fail():
    assert isinstance(engines.detect_gpus(), list)


def test_serve_refuses_a_foreign_plan_before_starting_anything(tmp_path, monkeypatch):
    """The supervisor's one call: EngineMismatch surfaces from Supervisor.start before any child."""
    from app.core.settings import Settings
    from app.serve.supervisor import Supervisor

    make_plan(tmp_path, built_on=T4)
    monkeypatch.setattr(engines, "detect_gpus", lambda: [A10G])
    supervisor = Supervisor(Settings(model_repository=tmp_path), {"PATH": "/nonexistent"})
    with pytest.raises(EngineMismatch):
        supervisor.start(tmp_path / "runtime")
    assert supervisor.children == []


def test_the_tensorrt_target_records_the_gpu_beside_the_plan(tmp_path, monkeypatch):
    from scripts.model_prep import tensorrt_engine

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"engine")
    monkeypatch.setattr(engines, "detect_gpus", lambda: [T4, A10G])
    tensorrt_engine.record_gpu(plan, "10.8.0")
    assert engines.read_record(plan) == T4  # TensorRT builds on the first visible device
    assert '"tensorrt_version": "10.8.0"' in engines.record_path(plan).read_text()


def test_no_gpu_no_record(tmp_path, monkeypatch):
    from scripts.model_prep import tensorrt_engine

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"engine")
    monkeypatch.setattr(engines, "detect_gpus", list)
    tensorrt_engine.record_gpu(plan, "10.8.0")
    assert not engines.record_path(plan).exists()
