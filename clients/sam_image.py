"""SAM's image geometry as pure numpy functions, each beside its inverse: ``SamProcessor``'s
pre-processing (the image to ``pixel_values``, the prompts' coordinates to the resized image) and
``post_process_masks`` (low-resolution mask logits back to the image's pixels).

- ``Processing``: what ``preprocessor_config.json`` (or ``processor_config.json``) sets: the longest
  side, the padded size, the rescale factor, the mean and std.
- ``resized_size``: ``SamImageProcessor._get_preprocess_shape`` (the longest side to ``longest_edge``,
  each side rounded half up).
- ``resize``: the bilinear, antialiased resize of uint8 pixels that the processor's torchvision backend
  runs (torch's integer kernel: float weights of PIL's triangle filter, quantised to 16 bits at the
  widest precision that fits, width first then height, each pass rounded and clipped to uint8): the
  same pixels, not within one level of them.
- ``pixel_values``: resized, rescaled and normalised in float32, padded bottom and right with zeros.
- ``scale_points`` / ``unscale_points``: original pixels <-> the resized image's (the processor's
  ``_normalize_coordinates``, in float64 as it computes them).
- ``mask_logits``: ``post_process_masks(binarize=False)``: bilinear (half-pixel, no antialias) to the
  padded size, cropped to the resized size, bilinear to the original size. Each resize along an axis
  is a matrix of two taps a row, so the chain is two small matrix products per mask, ``A_h @ M @
  A_w.T``, with no padded-size intermediate.
- ``mask_box``: a mask's tight box, as the mask-generation pipeline's ``bounding_boxes``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
WEIGHT_BITS = 15  # torch's antialiased uint8 kernel keeps its weights in int16
MAX_PRECISION = 22


class ProcessingError(ValueError):
    """A processor config that this module does not reproduce (the message names the file)."""


@dataclass(frozen=True)
class Processing:
    """``SamImageProcessor``'s settings."""

    longest_edge: int
    pad_height: int
    pad_width: int
    rescale_factor: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def read(cls, folder: Path) -> Processing:
        """From a save_pretrained folder: ``preprocessor_config.json``, else ``processor_config.json``'s
        ``image_processor``; a setting it does not reproduce is refused, naming the file."""
        path = next((folder / name for name in PROCESSOR_FILES if (folder / name).is_file()), None)
        if path is None:
            raise ProcessingError(
                f"{folder}: no {' or '.join(PROCESSOR_FILES)} (SamProcessor.save_pretrained writes it)"
            )
        settings: Mapping[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        settings = settings.get("image_processor", settings)
        for flag in ("do_resize", "do_rescale", "do_normalize", "do_pad"):
            if settings.get(flag, True) is not True:
                raise ProcessingError(
                    f"{path}: {flag} false is not served (SAM's processor resizes, rescales, normalises and pads)"
                )
        if settings.get("resample", 2) != 2:
            raise ProcessingError(f"{path}: resample {settings['resample']} is not served (2: bilinear)")
        try:
            pad = settings.get("pad_size") or {"height": 1024, "width": 1024}
            return cls(
                longest_edge=int((settings.get("size") or {"longest_edge": 1024})["longest_edge"]),
                pad_height=int(pad["height"]),
                pad_width=int(pad["width"]),
                rescale_factor=float(settings.get("rescale_factor", 1 / 255)),
                mean=tuple(float(v) for v in settings.get("image_mean", (0.485, 0.456, 0.406))),
                std=tuple(float(v) for v in settings.get("image_std", (0.229, 0.224, 0.225))),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ProcessingError(f"{path}: size, pad_size, image_mean or image_std not readable: {error}") from None


def resized_size(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) after the longest side is resized to ``longest_edge``."""
    scale = longest_edge * 1.0 / max(height, width)
    return int(height * scale + 0.5), int(width * scale + 0.5)


def _taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The first input index and the quantised weights of each output, and their precision."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(n_out) + 0.5)
    first = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    sizes = np.minimum((centers + support + 0.5).astype(np.int64), n_in) - first
    taps = np.arange(int(sizes.max()))
    weights = np.clip(1.0 - np.abs((taps[None, :] + first[:, None] - centers[:, None] + 0.5) * inverse), 0.0, None)
    weights[taps[None, :] >= sizes[:, None]] = 0.0
    weights /= weights.sum(axis=1, keepdims=True)
    largest, precision = weights.max(), 0
    while precision < MAX_PRECISION and int(0.5 + largest * (1 << (precision + 1))) < (1 << WEIGHT_BITS):
        precision += 1
    return first, np.floor(weights * (1 << precision) + 0.5).astype(np.int64), precision


def _resize_axis(pixels: np.ndarray, n_out: int, axis: int) -> np.ndarray:
    n_in = pixels.shape[axis]
    if n_in == n_out:
        return pixels
    first, weights, precision = _taps(n_in, n_out)
    source = np.moveaxis(pixels, axis, 0)
    total = np.full((n_out, *source.shape[1:]), 1 << (precision - 1), dtype=np.int64)
    for tap in range(weights.shape[1]):
        rows = np.minimum(first + tap, n_in - 1)
        total += weights[:, tap].reshape(-1, *([1] * (source.ndim - 1))) * source[rows]
    return np.moveaxis(np.clip(total >> precision, 0, 255).astype(np.uint8), 0, axis)


def resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """HWC uint8 -> (height, width) as the processor's bilinear antialiased resize gives it."""
    return _resize_axis(_resize_axis(pixels, width, 1), height, 0)


def pixel_values(pixels: np.ndarray, processing: Processing) -> tuple[np.ndarray, tuple[int, int]]:
    """HWC uint8 RGB -> the encoder's (3, pad_height, pad_width) float32 input and the resized size."""
    height, width = resized_size(pixels.shape[0], pixels.shape[1], processing.longest_edge)
    if height > processing.pad_height or width > processing.pad_width:
        raise ProcessingError(f"the resized image {height}x{width} exceeds the padded size")
    resized = resize(pixels, height, width).astype(np.float32)
    mean = np.asarray(processing.mean, dtype=np.float32) / np.float32(processing.rescale_factor)
    std = np.asarray(processing.std, dtype=np.float32) / np.float32(processing.rescale_factor)
    values = np.zeros((3, processing.pad_height, processing.pad_width), dtype=np.float32)
    values[:, :height, :width] = ((resized - mean) / std).transpose(2, 0, 1)
    return values, (height, width)


def scale_points(points: np.ndarray, original: tuple[int, int], resized: tuple[int, int]) -> np.ndarray:
    """(..., 2) x, y in the original image's pixels -> the resized image's, float64."""
    scaled = np.array(points, dtype=np.float64)
    scaled[..., 0] *= resized[1] / original[1]
    scaled[..., 1] *= resized[0] / original[0]
    return scaled


def unscale_points(points: np.ndarray, original: tuple[int, int], resized: tuple[int, int]) -> np.ndarray:
    """``scale_points``' inverse."""
    return scale_points(points, resized, original)


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """torch's bilinear resize along one axis (align_corners false, no antialias) as an (n_out, n_in) matrix."""
    scale = np.float32(n_in) / np.float32(n_out)
    source = np.maximum(scale * (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5), 0)
    low = np.minimum(source.astype(np.int64), n_in - 1)
    high = np.where(low < n_in - 1, low + 1, low)
    upper = np.clip(source - low.astype(np.float32), 0, 1)
    matrix = np.zeros((n_out, n_in), dtype=np.float64)
    rows = np.arange(n_out)
    np.add.at(matrix, (rows, low), np.float32(1) - upper)
    np.add.at(matrix, (rows, high), upper)
    return matrix


def upscaling(
    low_res: tuple[int, int], resized: tuple[int, int], original: tuple[int, int], padded: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The two matrices of ``mask_logits``: (H, h) and the transposed (w, W)."""
    rows = resize_matrix(resized[0], original[0]) @ resize_matrix(low_res[0], padded[0])[: resized[0]]
    columns = resize_matrix(resized[1], original[1]) @ resize_matrix(low_res[1], padded[1])[: resized[1]]
    return rows.astype(np.float32), np.ascontiguousarray(columns.T.astype(np.float32))


def mask_logits(
    masks: np.ndarray, resized: tuple[int, int], original: tuple[int, int], padded: tuple[int, int]
) -> np.ndarray:
    """(..., h, w) low-resolution logits -> (..., H, W) logits in the original image's pixels."""
    rows, columns = upscaling(masks.shape[-2:], resized, original, padded)
    return rows @ np.asarray(masks, dtype=np.float32) @ columns


def mask_box(mask: np.ndarray) -> list[int]:
    """A mask's tight box ``[xmin, ymin, xmax, ymax]``, the last pixel included; [0, 0, 0, 0] if empty."""
    columns = np.flatnonzero(mask.any(axis=0))
    rows = np.flatnonzero(mask.any(axis=1))
    if columns.size == 0:
        return [0, 0, 0, 0]
    return [int(columns[0]), int(rows[0]), int(columns[-1]), int(rows[-1])]
