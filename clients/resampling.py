"""torch's antialiased resize of uint8 pixels (``F.interpolate(uint8, antialias=True)``, what the image
processors' torchvision backend runs), in numpy: the same pixels, not within one level of them.

torch's integer kernel: each output's float weights (PIL's filters: a triangle for bilinear, Keys'
cubic with a = -0.5 for bicubic, stretched by the scale when shrinking) are quantised to 16 bits at the
widest precision that fits, and the image is resized width first then height, each pass rounded and
saturated to uint8. A pass whose size does not change is skipped, as torch skips it.
"""

from __future__ import annotations

import numpy as np

WEIGHT_BITS = 15  # torch's antialiased uint8 kernel keeps its weights in int16
MAX_PRECISION = 22
BILINEAR, BICUBIC = "bilinear", "bicubic"


def _triangle(x: np.ndarray) -> np.ndarray:
    return np.clip(1.0 - np.abs(x), 0.0, None)


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


FILTERS = {BILINEAR: (_triangle, 1.0), BICUBIC: (_cubic, 2.0)}  # the kernel and its radius


def taps(n_in: int, n_out: int, mode: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The first input index and the quantised weights of each output, and their precision."""
    kernel, radius = FILTERS[mode]
    scale = n_in / n_out
    support = radius * max(scale, 1.0)
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(n_out) + 0.5)
    first = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    sizes = np.minimum((centers + support + 0.5).astype(np.int64), n_in) - first
    offsets = np.arange(int(sizes.max()))
    weights = kernel((offsets[None, :] + first[:, None] - centers[:, None] + 0.5) * inverse)
    weights[offsets[None, :] >= sizes[:, None]] = 0.0
    weights /= weights.sum(axis=1, keepdims=True)
    largest, precision = weights.max(), 0
    while precision < MAX_PRECISION and int(0.5 + largest * (1 << (precision + 1))) < (1 << WEIGHT_BITS):
        precision += 1
    scaled = weights * (1 << precision)
    return first, np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int64), precision


def _resize_axis(pixels: np.ndarray, n_out: int, axis: int, mode: str) -> np.ndarray:
    n_in = pixels.shape[axis]
    if n_in == n_out:
        return pixels
    first, weights, precision = taps(n_in, n_out, mode)
    source = np.moveaxis(pixels, axis, 0)
    total = np.full((n_out, *source.shape[1:]), 1 << (precision - 1), dtype=np.int64)
    for tap in range(weights.shape[1]):
        rows = np.minimum(first + tap, n_in - 1)
        total += weights[:, tap].reshape(-1, *([1] * (source.ndim - 1))) * source[rows]
    return np.moveaxis(np.clip(total >> precision, 0, 255).astype(np.uint8), 0, axis)


def resize(pixels: np.ndarray, height: int, width: int, mode: str = BILINEAR) -> np.ndarray:
    """HWC uint8 -> (height, width) as torch's antialiased ``mode`` resize of uint8 gives it."""
    return _resize_axis(_resize_axis(pixels, width, 1, mode), height, 0, mode)
