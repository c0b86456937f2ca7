"""Helpers for the reference-fidelity tests: real sample photos, ONNX Runtime standing in for Triton,
and the small text models (scripts.model_prep.small_models) prepared and served in process."""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from app.core.settings import PROJECT_ROOT
from scripts.sagemaker.model_archives import export_cache

SAMPLES = PROJECT_ROOT / "build" / "samples"
DARKNET_PHOTOS = ("dog", "person", "horses", "eagle", "giraffe", "kite")
SKIMAGE_PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")


def darknet_photos() -> dict[str, bytes]:
    """The JPEGs of Debian's darknet package, fetched by `make samples` when they are missing."""
    if not all((SAMPLES / f"{name}.jpg").is_file() for name in DARKNET_PHOTOS):
        subprocess.run(["make", "samples"], cwd=PROJECT_ROOT, check=True)
    return {f"{name}.jpg": (SAMPLES / f"{name}.jpg").read_bytes() for name in DARKNET_PHOTOS}


def skimage_photos() -> dict[str, bytes]:
    """scikit-image's sample photos, encoded losslessly as PNG (one of them in grey); encoded once
    per process (five test modules take them at collection)."""
    return dict(_skimage_pngs())


@cache
def _skimage_pngs() -> tuple[tuple[str, bytes], ...]:
    from skimage import data

    photos = {}
    for name in SKIMAGE_PHOTOS:
        buffer = io.BytesIO()
        Image.fromarray(getattr(data, name)()).save(buffer, format="PNG")
        photos[f"{name}.png"] = buffer.getvalue()
    buffer = io.BytesIO()
    Image.fromarray(data.camera()).save(buffer, format="PNG")  # mode L: the grey path of the decoder
    photos["camera-grey.png"] = buffer.getvalue()
    return tuple(photos.items())


def real_photos() -> dict[str, bytes]:
    return {**skimage_photos(), **darknet_photos()}


class OnnxTriton:
    """A stand-in for ``clients.triton.TritonClient``: runs ``<repository>/<model>/1/model.onnx``
    with ONNX Runtime, the same file the python target's ``model.py`` runs inside Triton, recording
    the shapes each call was given."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.sessions: dict = {}
        self.calls: list[tuple[str, dict[str, tuple[int, ...]]]] = []  # (model, each input's shape) of every call

    def session(self, model: str):
        import onnxruntime as ort

        if model not in self.sessions:
            path = self.repository / model / "1" / "model.onnx"
            self.sessions[model] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return self.sessions[model]

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        version: str | None = None,
    ) -> tuple[dict[str, np.ndarray], str]:
        session = self.session(model)
        self.calls.append((model, {name: array.shape for name, array in inputs.items()}))
        outputs = session.run(list(output_names), dict(inputs))
        return dict(zip(output_names, outputs)), version or "1"


def prepare_text_repository(models: Path, repository: Path, *extra: str, cache: Path | None = None) -> Path:
    """``python -m scripts.model_prep`` of every model in ``models`` into ``repository`` (python target;
    ``cache``: an export cache to start from)."""
    from scripts.model_prep import cli

    own = export_cache(repository.parent / "cache", cache, [path.name for path in models.iterdir()])
    assert cli.main(["--source", str(models), "--repository", str(repository), "--cache-dir", str(own), *extra]) == 0
    return repository


def served_copy(repository: Path, names, target: Path) -> Path:
    """The prepared models ``names`` of a shared repository, copied into ``target`` for a stack to
    serve (Triton's python stubs write into their models' folders; the shared one is only read)."""
    for name in names:
        shutil.copytree(repository / name, target / name)
    return target


def in_process_clients(repository: Path, triton=None) -> dict[str, Any]:
    """Every model of a prepared repository as its family's client, ONNX Runtime standing in for
    Triton (``triton``: the stand-in to share, whose calls a test reads)."""
    from app.core.settings import Settings
    from clients.families import find_specs, make_client

    triton = triton or OnnxTriton(repository)
    settings = Settings(model_repository=repository, max_image_pixels=1_000_000, max_batch_items=64)
    return {name: make_client(spec, triton, settings) for name, spec in find_specs(repository).items()}
