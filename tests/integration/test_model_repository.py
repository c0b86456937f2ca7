"""The built repository under a real Triton (the nvidia-pytriton binary), spoken to over gRPC directly."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from app.core.pipeline import triton_models
from app.core.spec import ModelSpec, find_specs

pytestmark = pytest.mark.integration


def random_inputs(spec: ModelSpec, batch: int, seed: int = 0) -> list[grpcclient.InferInput]:
    rng = np.random.default_rng(seed)
    inputs = []
    for tensor in spec.inputs:
        shape = (batch, *tensor.dims)
        if np.issubdtype(tensor.numpy_dtype, np.integer):
            array = rng.integers(1000, 2000, shape).astype(tensor.numpy_dtype)
        else:
            array = rng.standard_normal(shape).astype(tensor.numpy_dtype)
        item = grpcclient.InferInput(tensor.name, list(shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


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
        "yolov5_postprocess",
        "yolov5_pipeline",
    }


@pytest.mark.parametrize("name", ["resnet", "yolov5", "bert_base"])
def test_batch_of_two_gives_the_documented_shapes(triton, repository: Path, name: str):
    spec = find_specs(repository)[name]
    outputs = [grpcclient.InferRequestedOutput(t.name) for t in spec.outputs]
    result = triton.infer(name, random_inputs(spec, batch=2), outputs=outputs)
    for tensor in spec.outputs:
        array = result.as_numpy(tensor.name)
        print(f"{name}.{tensor.name}: {array.shape} {array.dtype}")
        assert array.shape == (2, *tensor.dims)
        assert array.dtype == tensor.numpy_dtype
    documented = {
        "resnet": {"scores": (2, 1000), "classes": (2, 1000)},
        "yolov5": {"output": (2, 25200, 85)},
        "bert_base": {"scores": (2, 128, 50), "token_ids": (2, 128, 50)},
    }[name]
    assert {t: result.as_numpy(t).shape for t in documented} == documented


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
