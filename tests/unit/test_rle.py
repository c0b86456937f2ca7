"""clients.rle against pycocotools: the same counts string for every mask (empty, full, one pixel,
noise of every density, blocks with long runs, thresholded photos, a 0-row mask), decoded back to the
mask by both, and pycocotools' own strings (bytes or text) decoded by ours."""

from __future__ import annotations

import io
from functools import cache

import numpy as np
import pycocotools.mask as coco
import pytest
from PIL import Image

from clients import rle
from tests.references import darknet_photos


@cache
def masks() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    found = [np.zeros((5, 7), bool), np.ones((5, 7), bool), np.eye(4, 5, dtype=bool), np.zeros((0, 5), bool)]
    single = np.zeros((9, 11), bool)
    single[0, 0] = True
    found.append(single)
    for height, width in ((1, 1), (1, 9), (9, 1), (480, 640), (1000, 333)):
        found += [rng.random((height, width)) < p for p in (0.01, 0.5, 0.99)]
    for _ in range(10):  # blocks: runs of thousands of pixels, differences of either sign
        height, width = rng.integers(1, 900, 2)
        blocks = rng.random((height // 32 + 1, width // 32 + 1)) < rng.random()
        found.append(np.kron(blocks, np.ones((32, 32), bool))[:height, :width])
    for data in darknet_photos().values():
        grey = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
        found += [grey > 128, grey < 40]
    return found


def pycocotools_rle(mask: np.ndarray) -> dict:
    return coco.encode(np.asfortranarray(mask.astype(np.uint8)))


@pytest.mark.parametrize("index", range(len(masks())))
def test_encode_writes_what_pycocotools_writes_and_both_decode_it(index):
    mask = masks()[index]
    ours, theirs = rle.encode(mask), pycocotools_rle(mask)
    assert ours == {"size": theirs["size"], "counts": theirs["counts"].decode("ascii")}
    assert np.array_equal(coco.decode({"size": ours["size"], "counts": ours["counts"].encode()}), mask.astype(np.uint8))
    assert np.array_equal(rle.decode(theirs), mask.astype(np.uint8))
    assert np.array_equal(rle.decode(ours), mask.astype(np.uint8))


def test_decode_refuses_counts_that_do_not_cover_the_size():
    with pytest.raises(ValueError, match="not 4x6"):
        rle.decode({"size": [4, 6], "counts": rle.encode(np.ones((4, 5), bool))["counts"]})
