"""Fixtures for the Flask app: a model repository of tiny spec folders and a fake Triton.

The fake answers with arrays of each spec's output shapes, computed from the inputs so that
results can be told apart (and their order checked), and records every call. An image model's
ensemble (``<name>_pipeline``) runs the real python-backend steps
(``app/triton/image_steps.py``) around the fake network, as Triton would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from app.core.pipeline import (
    DETECTION_OPTIONS,
    DETECTIONS,
    ENSEMBLE_SUFFIX,
    IMAGE,
    IMAGE_LENGTH,
    IMAGE_SIZE,
    NUM_DETECTIONS,
    triton_models,
)
from app.core.settings import Settings
from app.router import create_app
from app.triton.image_steps import load_client, postprocess_batch, preprocess_batch
from clients.families import find_specs
from tests.support import make_spec_repository


class FakeTriton:
    """Stands in for clients.triton.TritonClient: outputs of the right shapes, recorded calls."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.specs = find_specs(repository)
        self.steps: dict = {}  # the pipeline steps' clients, by network
        self.calls: list[tuple[str, dict[str, tuple[int, ...]], str | None]] = []
        self.states = {
            model: "READY" for name, spec in self.specs.items() for model in triton_models(name, spec.pipeline)
        }
        self.ready = True
        self.live = True
        self.error: Exception | None = None  # raised by infer when set
        self.readiness_error: Exception | None = None  # raised by model_states when set
        self.version = "1"
        self._lock = threading.Lock()
        self.detections: list[tuple[float, float, float, float, float, int]] = [
            (320.0, 480.0, 100.0, 200.0, 0.9, 16),
            (100.0, 100.0, 50.0, 50.0, 0.6, 0),
        ]

    def infer(self, model, inputs, output_names, version=None):
        with self._lock:
            self.calls.append((model, {k: v.shape for k, v in inputs.items()}, version))
        if self.error is not None:
            raise self.error
        if model.endswith(ENSEMBLE_SUFFIX):
            return self._ensemble(model.removesuffix(ENSEMBLE_SUFFIX), inputs, output_names), version or self.version
        spec = self.specs[model]
        for tensor in spec.inputs:
            array = inputs[tensor.name]
            assert array.dtype == tensor.numpy_dtype, (tensor.name, array.dtype)
            assert array.shape[1:] == tensor.dims, (tensor.name, array.shape)
        batch = next(iter(inputs.values())).shape[0]
        maker: Callable = getattr(self, f"_{spec.family}")
        outputs = maker(spec, inputs, batch)
        if DETECTIONS in output_names:  # a detector's network with its postprocessing in the graph
            options = {option: inputs[option] for option in DETECTION_OPTIONS}
            client = self.steps.setdefault(model, load_client(self.repository / model))
            detections, counts = postprocess_batch(client, outputs[spec.outputs[0].name], inputs[IMAGE_SIZE], options)
            outputs = {DETECTIONS: detections, NUM_DETECTIONS: counts}
        return {name: outputs[name] for name in output_names}, version or self.version

    def _ensemble(self, name, inputs, output_names):
        """The steps Triton runs for ``<name>_pipeline``: preprocess, the (fake) network, NMS."""
        spec = self.specs[name]
        client = self.steps.setdefault(name, load_client(self.repository / name))
        steps = preprocess_batch(client, inputs[IMAGE], inputs[IMAGE_LENGTH])  # InvalidItem: not decodable
        tensor = steps[spec.inputs[0].name]
        outputs = getattr(self, f"_{spec.family}")(spec, {spec.inputs[0].name: tensor}, len(tensor))
        if spec.family == "detection":  # the graph's NMS, as the numpy reference computes it
            options = {option: inputs[option] for option in DETECTION_OPTIONS}
            detections, counts = postprocess_batch(client, outputs[spec.outputs[0].name], steps[IMAGE_SIZE], options)
            outputs = {DETECTIONS: detections, NUM_DETECTIONS: counts}
        return {output: outputs[output] for output in output_names}

    def _image_classification(self, spec, inputs, batch):
        # class = a value derived from the image's mean brightness, so different images differ
        pixels = inputs[spec.inputs[0].name]
        classes = spec.outputs[0].dims[0]
        logits = np.zeros((batch, classes), dtype=np.float32)
        for i in range(batch):
            best = int(abs(float(pixels[i].mean())) * 100) % classes
            logits[i, best] = 10.0
            logits[i, (best + 1) % classes] = 5.0
        if len(spec.outputs) == 1:
            return {spec.outputs[0].name: logits}
        # the graph ranks: probabilities and class indices, best first
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = exp / exp.sum(axis=1, keepdims=True)
        ranked = np.argsort(-probabilities, axis=1, kind="stable")
        return {
            spec.outputs[0].name: np.take_along_axis(probabilities, ranked, axis=1),
            spec.outputs[1].name: ranked.astype(spec.outputs[1].numpy_dtype),
        }

    def _detection(self, spec, inputs, batch):
        rows, cols = spec.outputs[0].dims
        output = np.zeros((batch, rows, cols), dtype=np.float32)
        for i in range(batch):
            for j, (cx, cy, w, h, score, cls) in enumerate(self.detections):
                output[i, j, :4] = (cx, cy, w, h)
                output[i, j, 4] = 1.0
                output[i, j, 5 + cls] = score
        return {spec.outputs[0].name: output}

    def _fill_mask(self, spec, inputs, batch):
        length, k = spec.outputs[0].dims
        scores = np.tile(np.linspace(0.5, 0.01, k, dtype=np.float32), (batch, length, 1))
        ids = np.tile(np.arange(2000, 2000 + k, dtype=np.int64), (batch, length, 1))
        # the first candidate at every position tells the texts apart: their first real token
        ids[:, :, 0] = inputs["input_ids"][:, 1:2]
        return {"scores": scores, "token_ids": ids}

    def model_states(self):
        if self.readiness_error is not None:
            raise self.readiness_error
        return dict(self.states)

    def server_ready(self):
        return self.ready

    def server_live(self):
        return self.live


@pytest.fixture(scope="session")
def repository(tmp_path_factory) -> Path:
    return make_spec_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture
def settings(repository) -> Settings:
    return Settings(model_repository=repository, max_image_pixels=1_000_000, max_batch_items=64)


@pytest.fixture
def triton(repository) -> FakeTriton:
    return FakeTriton(repository)


@pytest.fixture
def fake_triton_class() -> type[FakeTriton]:
    return FakeTriton


@pytest.fixture
def app(settings, triton):
    return create_app(settings, triton=triton)


@pytest.fixture
def client(app):
    return app.test_client()
