"""The built repository under a real Triton (the nvidia-pytriton binary), spoken to over gRPC directly."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from app.core.pipeline import triton_models
from app.core.spec import ModelSpec
from clients.detection import geometry, option_arrays
from clients.families import find_specs
from scripts.model_prep import detector_graph
from tests.triton_calls import grpc_inputs

DEFAULT_OPTIONS = {"conf_threshold": 0.25, "iou_threshold": 0.45, "max_detections": 300}

pytestmark = pytest.mark.integration


def random_inputs(spec: ModelSpec, batch: int, seed: int = 0) -> list[grpcclient.InferInput]:
    """Random values for the network's own inputs; a detector's graph also takes a 640 x 480 image's
    letterbox geometry and the default options."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in spec.inputs:
        shape = (batch, *tensor.dims)
        if np.issubdtype(tensor.numpy_dtype, np.integer):
            arrays[tensor.name] = rng.integers(1000, 2000, shape).astype(tensor.numpy_dtype)
        else:
            arrays[tensor.name] = rng.standard_normal(shape).astype(tensor.numpy_dtype)
    if detector_graph.appends(spec):
        extra = {**geometry(640, (480, 640)), **option_arrays(DEFAULT_OPTIONS)}
        arrays.update({name: np.stack([array] * batch) for name, array in extra.items()})
    return grpc_inputs(arrays)


def test_every_model_is_ready(triton, repository: Path):
    index = {m.name: m.state for m in triton.get_model_repository_index().models}
    served = {model for name, spec in find_specs(repository).items() for model in triton_models(name, spec.pipeline)}
    assert served <= set(index)
    assert index == {folder.name: "READY" for folder in repository.iterdir() if (folder / "config.pbtxt").is_file()}
    # the image models' pipelines: the ensemble and its python-backend steps
    assert set(index) == {
        "resnet",
        "yolov5",
        "bert_base",
        "resnet_preprocess",
        "resnet_pipeline",
        "yolov5_preprocess",
        "yolov5_pipeline",
    }


@pytest.mark.parametrize("name", ["resnet", "yolov5", "bert_base"])
def test_batch_of_two_gives_the_documented_shapes(triton, repository: Path, name: str):
    spec = find_specs(repository)[name]
    _, served = detector_graph.served_tensors(spec)  # a detector's graph answers its detections
    outputs = [grpcclient.InferRequestedOutput(t.name) for t in served]
    result = triton.infer(name, random_inputs(spec, batch=2), outputs=outputs)
    for tensor in served:
        array = result.as_numpy(tensor.name)
        print(f"{name}.{tensor.name}: {array.shape} {array.dtype}")
        assert len(array) == 2 and all(want in (-1, got) for want, got in zip(tensor.dims, array.shape[1:]))
        assert array.dtype == tensor.numpy_dtype
    documented = {
        "resnet": {"scores": (2, 1000), "classes": (2, 1000)},
        "yolov5": {"num_detections": (2, 1)},  # and detections [2, the longer answer's rows, 6]
        "bert_base": {"scores": (2, 128, 50), "token_ids": (2, 128, 50)},
    }[name]
    assert {t: result.as_numpy(t).shape for t in documented} == documented
    if name == "yolov5":
        counts = result.as_numpy("num_detections").reshape(-1)
        assert result.as_numpy("detections").shape == (2, max(1, int(counts.max())), 6)


def test_sixteen_concurrent_requests_form_batches(triton, repository: Path):
    spec = find_specs(repository)["resnet"]
    outputs = [grpcclient.InferRequestedOutput("scores")]

    def stats() -> tuple[int, int]:
        s = triton.get_inference_statistics("resnet").model_stats[0]
        return s.inference_count, s.execution_count

    before = stats()
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(lambda i: triton.infer("resnet", random_inputs(spec, 1, seed=i), outputs=outputs), range(16))
        )
    # Triton records an execution's statistics just after its responses are sent: let them land.
    deadline = time.monotonic() + 5
    while (after := stats())[0] - before[0] < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    print(f"16 concurrent requests: {inferences} inferences in {executions} executions")
    assert all(r.as_numpy("scores").shape == (1, 1000) for r in results)
    assert inferences == 16
    assert executions < inferences
