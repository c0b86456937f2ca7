"""Issue check 1: the image-classification client's preprocessing against torchvision's ImageNet eval
transform on real photos, and the model's top-5 on both tensors (the built ResNet50 ONNX, random
weights, run with ONNX Runtime)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from torchvision import transforms

from app.settings import Settings
from clients.resnet import ImageClassificationClient, softmax
from clients.spec import load_spec
from tests.references import OnnxTriton, real_photos
from tests.stack import built_test_repository

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
REFERENCE = transforms.Compose(
    [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
)

# Tolerance: 0 (bit-equal). Both sides decode with PIL, resize with the same PIL bilinear filter
# to the same size, crop the same box, and normalise in float32 as torch does ((v / 255 - mean) /
# std, tabulated per uint8 value): there is no step where the two may round differently, so any
# difference at all would be a bug, not noise.
TOLERANCE = 0.0

PHOTOS = real_photos()


@pytest.fixture(scope="module")
def client() -> ImageClassificationClient:
    repository = built_test_repository()
    return ImageClassificationClient(load_spec(repository / "resnet"), OnnxTriton(repository), Settings())


def reference_tensor(data: bytes) -> np.ndarray:
    return REFERENCE(Image.open(io.BytesIO(data)).convert("RGB")).numpy()


def test_at_least_six_real_photos():
    assert len(PHOTOS) >= 6


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_preprocessing_and_top5_equal_torchvision(client, name):
    data = PHOTOS[name]
    ours, _ = client.preprocess(base64.b64encode(data).decode(), "payload.img", {"topk": 5})
    ours = ours[client.spec.inputs[0].name]
    theirs = reference_tensor(data)
    assert ours.shape == theirs.shape == (3, 224, 224) and ours.dtype == theirs.dtype == np.float32
    max_diff = float(np.max(np.abs(ours - theirs)))
    assert max_diff <= TOLERANCE

    session = client.triton.session(client.name)
    (logits,) = session.run(None, {client.spec.inputs[0].name: np.stack([ours, theirs])})
    top5 = [np.argsort(-softmax(row), kind="stable")[:5].tolist() for row in logits]
    result, _ = client.inference({"img": base64.b64encode(data).decode(), "topk": 5})
    served = [c["index"] for c in result]
    print(f"{name}: {Image.open(io.BytesIO(data)).size} max|ours - torchvision| = {max_diff:g}; "
          f"top-5 ours {top5[0]} torchvision {top5[1]} served {served} "
          f"scores {[round(c['score'], 6) for c in result]}")
    assert top5[0] == top5[1] == served
    reference_scores = softmax(logits[1])[top5[1]]
    np.testing.assert_allclose([c["score"] for c in result], reference_scores, rtol=0, atol=1e-6)
