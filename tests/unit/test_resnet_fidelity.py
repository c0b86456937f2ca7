"""Issue check 1: the image-classification client's preprocessing against torchvision's ImageNet eval
transform on real photos, and the model's top-5 on both tensors (the built ResNet50 ONNX, random
weights, run with ONNX Runtime; its graph ends in softmax + ranking). Both paths: the exact one (``fast_path = false``) and the fast one
resnet is served with (``fast_path = true``: JPEG draft-mode decode, only the crop resized)."""

from __future__ import annotations

import base64
import dataclasses
import io

import numpy as np
import pytest
from PIL import Image
from torchvision import transforms

from app.core.pipeline import ROUTER
from app.core.settings import Settings
from clients.classification import ImageClassificationClient
from clients.families import load_spec
from scripts.devtools import built_test_repository
from tests.references import OnnxTriton, real_photos

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
REFERENCE = transforms.Compose(
    [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
)

# Tolerance: 0 (bit-equal). Both sides decode with PIL, resize with the same PIL bilinear filter
# to the same size, crop the same box, and normalise in float32 as torch does ((v / 255 - mean) /
# std, tabulated per uint8 value): there is no step where the two may round differently, so any
# difference at all would be a bug, not noise.
TOLERANCE = 0.0

# Tolerance of the fast path: a mean |ours - torchvision| of at most 3 levels in 255 per photo, and the
# same top-5. Decoding a JPEG at half (or a quarter, an eighth) of its size averages blocks of
# pixels (libjpeg's scaled IDCT, a box filter) where torchvision's resize weighs them with a
# triangle, so the image comes out slightly softer: single pixels on sharp edges move by up to
# about 50 levels, the mean by 0.5 to 2.3 levels on the four photos here large enough to be drafted
# (the eagle's feathers the most). Photos smaller than twice 256 pixels, and PNGs, are decoded whole
# and differ by at most one level, from rounding the crop box. A classifier's answer does not move
# on that: the top-5 must be equal.
FAST_MEAN_LEVELS = 3.0

PHOTOS = real_photos()


@pytest.fixture(scope="module", params=["exact", "fast"])
def client(request) -> ImageClassificationClient:
    repository = built_test_repository()
    spec = load_spec(repository / "resnet")
    assert spec.preprocess.get("fast_path") is True  # resnet is served on the fast path
    fast = request.param == "fast"
    # the router's pipeline (this file checks its preprocessing; tests/integration/test_pipeline_fidelity.py
    # checks Triton's)
    spec = dataclasses.replace(spec, preprocess={**spec.preprocess, "fast_path": fast}, pipeline=ROUTER)
    return ImageClassificationClient(spec, OnnxTriton(repository), Settings())


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
    levels = np.abs(ours - theirs) * np.asarray(STD, dtype=np.float32)[:, None, None] * 255
    if client.fast_path:
        assert float(levels.mean()) <= FAST_MEAN_LEVELS
    else:
        assert max_diff <= TOLERANCE

    session = client.triton.session(client.name)
    # the graph ranks: probabilities (softmax) and class indices, best first
    scores, classes = session.run(None, {client.spec.inputs[0].name: np.stack([ours, theirs])})
    top5 = [row[:5].tolist() for row in classes]
    result, _ = client.inference({"img": base64.b64encode(data).decode(), "topk": 5})
    served = [c["index"] for c in result]
    path = "fast" if client.fast_path else "exact"
    print(
        f"{name} ({path}): {Image.open(io.BytesIO(data)).size} max|ours - torchvision| = {max_diff:g} "
        f"(mean {levels.mean():.2f}, max {levels.max():.1f} levels); "
        f"top-5 ours {top5[0]} torchvision {top5[1]} served {served} "
        f"scores {[round(c['score'], 6) for c in result]}"
    )
    assert top5[0] == top5[1] == served
    np.testing.assert_allclose([c["score"] for c in result], scores[0][:5], rtol=0, atol=1e-6)
