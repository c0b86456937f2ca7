"""The shipped architectures at full size (ResNet50, YOLOv5s, BERT base; random weights), served by
the real stack: one request per model. Every other integration test serves small networks of the
same families (same tensors and processing, a fraction of the arithmetic), so this is where the
full-size networks are loaded and called."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from scripts.devtools import Stack
from tests.references import real_photos
from tests.support import ONE_INSTANCE

pytestmark = pytest.mark.integration

# Each full-size network's ONNX file is at least this big (ResNet50 ~98 MB, YOLOv5s ~28 MB, BERT
# base ~420 MB); the small networks' are under 5 MB.
FULL_SIZE_BYTES = {"resnet": 90_000_000, "yolov5": 25_000_000, "bert_base": 400_000_000}


@pytest.fixture(scope="module")
def full(full_repository: Path, tmp_path_factory: pytest.TempPathFactory, stopping):
    started = Stack(full_repository, env_extra=ONE_INSTANCE).start(tmp_path_factory.mktemp("full-size-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


def onnx_bytes(repository: Path, model: str) -> int:
    return (repository / model / "1" / "model.onnx").stat().st_size


def test_the_full_size_networks_are_served(full):
    sizes = {model: onnx_bytes(full.repository, model) for model in FULL_SIZE_BYTES}
    print(f"full-size ONNX files: { {m: f'{b / 1e6:.0f} MB' for m, b in sizes.items()} }")
    assert all(sizes[m] >= FULL_SIZE_BYTES[m] for m in FULL_SIZE_BYTES), sizes
    photo = real_photos()["dog.jpg"]
    for model in ("resnet", "yolov5"):
        r = requests.post(
            f"{full.url}/invocations",
            data=photo,
            timeout=120,
            headers={"Content-Type": "image/jpeg", "X-Amzn-SageMaker-Custom-Attributes": f"modelname={model}"},
        )
        assert r.status_code == 200 and r.json()["modelname"] == model, r.text[:300]
    r = requests.post(
        f"{full.url}/invocations",
        timeout=120,
        json={"modelname": "bert_base", "payload": {"text": "Paris is the [MASK] of France.", "topk": 4}},
    )
    assert r.status_code == 200, r.text[:300]
    candidates = r.json()["result"]
    assert len(candidates) == 4 and all(c["sequence"].startswith("paris is the") for c in candidates)
