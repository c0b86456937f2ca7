"""Helpers for the reference-fidelity tests: real sample photos, and ONNX Runtime standing in for Triton."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from app.core.settings import PROJECT_ROOT

SAMPLES = PROJECT_ROOT / "build" / "samples"
DARKNET_PHOTOS = ("dog", "person", "horses", "eagle", "giraffe", "kite")
SKIMAGE_PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")


def darknet_photos() -> dict[str, bytes]:
    """The JPEGs of Debian's darknet package, fetched by `make samples` when they are missing."""
    if not all((SAMPLES / f"{name}.jpg").is_file() for name in DARKNET_PHOTOS):
        subprocess.run(["make", "samples"], cwd=PROJECT_ROOT, check=True)
    return {f"{name}.jpg": (SAMPLES / f"{name}.jpg").read_bytes() for name in DARKNET_PHOTOS}


def skimage_photos() -> dict[str, bytes]:
    """scikit-image's sample photos, encoded losslessly as PNG (one of them in grey)."""
    from skimage import data

    photos = {}
    for name in SKIMAGE_PHOTOS:
        buffer = io.BytesIO()
        Image.fromarray(getattr(data, name)()).save(buffer, format="PNG")
        photos[f"{name}.png"] = buffer.getvalue()
    buffer = io.BytesIO()
    Image.fromarray(data.camera()).save(buffer, format="PNG")  # mode L: the grey path of the decoder
    photos["camera-grey.png"] = buffer.getvalue()
    return photos


def real_photos() -> dict[str, bytes]:
    return {**skimage_photos(), **darknet_photos()}


class OnnxTriton:
    """A stand-in for ``clients.triton.TritonClient``: runs ``<repository>/<model>/1/model.onnx``
    with ONNX Runtime, the same file the python target's ``model.py`` runs inside Triton."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.sessions: dict = {}
        self.calls: list[tuple[str, int]] = []  # (model, batch) of every infer call

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
        outputs = self.session(model).run(list(output_names), dict(inputs))
        self.calls.append((model, len(next(iter(inputs.values())))))
        return dict(zip(output_names, outputs)), version or "1"
