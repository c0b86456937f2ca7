"""A real Triton over gRPC, shared by the pipeline tests: one served on a repository with its
client, one inference, its input tensors, an encoded image and a detector's options as the
pipeline's tensors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from scripts.devtools import start_triton


@contextmanager
def served(repository: Path, runtime: Path, timeout_s: float = 180) -> Iterator:
    """A Triton on ``repository`` and a gRPC client (``tritonclient.grpc``) to it, ready; stopped
    with SIGTERM at the end (the python backend frees its shared memory then)."""
    import tritonclient.grpc as grpcclient

    triton = start_triton(repository, runtime)
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        triton.wait_ready(timeout_s)
        yield client
    finally:
        client.close()
        triton.stop()


def grpc_infer(triton, model: str, arrays: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    """One request to a Triton model over gRPC (``tritonclient.grpc``): its named outputs."""
    import tritonclient.grpc as grpcclient

    result = triton.infer(model, grpc_inputs(arrays), outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
    return {name: result.as_numpy(name) for name in outputs}


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def encoded_image(data: bytes) -> dict[str, np.ndarray]:
    """The pipeline's image tensors for one encoded image (batch 1)."""
    from app.core.pipeline import IMAGE, IMAGE_LENGTH

    return {IMAGE: np.frombuffer(data, dtype=np.uint8)[None], IMAGE_LENGTH: np.array([[len(data)]], dtype=np.int64)}


def option_tensors(*options: dict) -> dict[str, np.ndarray]:
    """A detector's options as tensors, one row per item."""
    return {
        "conf_threshold": np.array([[o["conf_threshold"]] for o in options], dtype=np.float32),
        "iou_threshold": np.array([[o["iou_threshold"]] for o in options], dtype=np.float32),
        "max_detections": np.array([[o["max_detections"]] for o in options], dtype=np.int32),
    }
