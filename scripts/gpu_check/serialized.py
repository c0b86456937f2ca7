"""An image model's DALI step as Triton's DALI backend runs it, on this machine's GPU.

When the backend loads ``<name>_preprocess``, it autoserializes the version folder's ``dali.py``: a
python process of its own imports the file as the module ``autoserialize_mod`` and calls
``nvidia.dali._utils.autoserialize.invoke_autoserialize(module, <file>)``, which serialises the one
``@autoserialize`` pipeline; the backend then deserialises it on the instance's GPU, with the
config's ``max_batch_size`` and its ``num_threads`` parameter. ``serialized_pipeline`` takes the same
steps: the file model preparation writes (``scripts/model_prep/dali_pipeline.py``, with the spec's
``[preprocess] decoder`` or the one given), serialised by the backend's script in a child process,
deserialised with ``nvidia.dali.Pipeline.deserialize`` on device 0.

``gpu_missing`` says in one line why that cannot run here (None when it can): no DALI, or no GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.core.pipeline import IMAGE, IMAGE_LENGTH
from app.core.spec import ModelSpec
from clients.vision import DECODERS
from scripts.model_prep import dali_pipeline

__all__ = [
    "DECODERS",
    "SERIALIZED_FILE",
    "SerializeError",
    "autoserialize",
    "deserialize",
    "encoded",
    "gpu_missing",
    "run",
    "run_to_cpu",
    "serialized_pipeline",
    "with_decoder",
]

SERIALIZED_FILE = "model.dali"
# The backend's autoserialization, as its command runs it (the two paths given as arguments here).
AUTOSERIALIZE = """\
import importlib.util, sys
from nvidia.dali._utils.autoserialize import invoke_autoserialize
spec = importlib.util.spec_from_file_location("autoserialize_mod", sys.argv[1])
head_module = importlib.util.module_from_spec(spec)
sys.modules["autoserialize_mod"] = head_module
spec.loader.exec_module(head_module)
invoke_autoserialize(head_module, sys.argv[2])
"""


class SerializeError(RuntimeError):
    """The pipeline file did not serialise (its child process failed)."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@functools.cache
def gpu_missing() -> str | None:
    """None when DALI runs a pipeline on a GPU here; else one line saying what is missing."""
    try:
        from nvidia.dali import backend
    except ImportError:
        return "nvidia.dali is not installed (make gpu-check installs DALI's CUDA wheel)"
    try:
        devices = backend.GetCUDADeviceCount()
    except RuntimeError as error:
        return f"no NVIDIA GPU on this machine (DALI: {_first_line(error)})"
    if devices < 1:
        return "no NVIDIA GPU on this machine (DALI sees no CUDA device)"
    try:
        _copy_to_gpu_and_back()
    except RuntimeError as error:
        return f"DALI cannot run a pipeline on the GPU here: {_first_line(error)}"
    return None


def _copy_to_gpu_and_back() -> None:
    """The smallest GPU pipeline: four bytes to device 0 and back."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=1, device_id=0)
    def probe():
        return fn.external_source(name="bytes", device="cpu", dtype=types.UINT8, ndim=1).gpu()

    pipeline = probe()
    pipeline.build()
    pipeline.feed_input("bytes", [np.arange(4, dtype=np.uint8)])
    (out,) = pipeline.run()
    if np.array(out.as_cpu()[0]).tolist() != [0, 1, 2, 3]:
        raise RuntimeError("a copy to the GPU and back changed the bytes")


def with_decoder(spec: ModelSpec, decoder: str | None) -> ModelSpec:
    """The spec with ``[preprocess] decoder`` set (``None``: the spec's own)."""
    if decoder is None:
        return spec
    return dataclasses.replace(spec, preprocess={**spec.preprocess, "decoder": decoder})


def autoserialize(module_path: Path, target: Path) -> Path:
    """``module_path`` (a ``dali.py``) serialised into ``target`` as the DALI backend does it."""
    result = subprocess.run(
        [sys.executable, "-c", AUTOSERIALIZE, str(module_path), str(target)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0 or not target.is_file():
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise SerializeError(f"{module_path}: autoserialization failed (exit {result.returncode}):\n{tail}")
    return target


def deserialize(path: Path, batch_size: int, num_threads: int, device_id: int = 0) -> Any:
    """The serialised pipeline, built, on ``device_id`` with the backend's batch size and threads."""
    from nvidia.dali import Pipeline

    return Pipeline.deserialize(filename=str(path), device_id=device_id, batch_size=batch_size, num_threads=num_threads)


def serialized_pipeline(
    spec: ModelSpec,
    folder: Path,
    batch_size: int,
    num_threads: int = dali_pipeline.GPU_THREADS,
    decoder: str | None = None,
) -> Any:
    """The model's step on the GPU as Triton runs it: ``folder/dali.py`` written for ``batch_size``
    (the config's ``max_batch_size``), serialised into ``folder/model.dali``, deserialised with
    ``num_threads`` (the config's ``num_threads`` parameter)."""
    spec = with_decoder(spec, decoder)
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / dali_pipeline.PIPELINE_FILE
    module.write_text(dali_pipeline.pipeline_file(spec, batch_size), encoding="utf-8")
    return deserialize(autoserialize(module, folder / SERIALIZED_FILE), batch_size, num_threads)


def encoded(images: Sequence[bytes], lengths: Sequence[int] | None = None) -> tuple[list, list]:
    """The step's two inputs for a batch: each image's bytes, and how many of them are the image."""
    lengths = [len(data) for data in images] if lengths is None else lengths
    return (
        [np.frombuffer(data, dtype=np.uint8) for data in images],
        [np.array([n], dtype=np.int64) for n in lengths],
    )


def run(pipeline: Any, inputs: tuple[list, list]) -> tuple:
    """One batch (``encoded``'s pair) through the pipeline: its outputs as DALI gives them (the
    network input on the GPU; a detector's image size and letterbox on the CPU)."""
    data, lengths = inputs
    pipeline.feed_input(IMAGE, data)
    pipeline.feed_input(IMAGE_LENGTH, lengths)
    return pipeline.run()


def run_to_cpu(pipeline: Any, images: Sequence[bytes], lengths: Sequence[int] | None = None) -> list[list]:
    """As ``dali_pipeline.run_cpu``: per output, one numpy array a sample (copied from the GPU)."""
    on_cpu = [batch.as_cpu() for batch in run(pipeline, encoded(images, lengths))]
    return [[np.array(batch[i]) for i in range(len(images))] for batch in on_cpu]
