"""SAM's image geometry as pure numpy functions, each beside its inverse: ``SamProcessor``'s
pre-processing (the image to ``pixel_values``, the prompts' coordinates to the resized image) and
``post_process_masks`` (low-resolution mask logits back to the image's pixels).

- ``Processing``: what ``preprocessor_config.json`` (or ``processor_config.json``) sets: the longest
  side, the padded size, the rescale factor, the mean and std.
- ``resized_size``: ``SamImageProcessor._get_preprocess_shape`` (the longest side to ``longest_edge``,
  each side rounded half up).
- the resize: ``clients.resampling`` (bilinear, antialiased, on uint8: the processor's torchvision
  backend's pixels exactly).
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

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients import processor_config, resampling

ProcessingError = processor_config.ProcessingError


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
        path, settings = processor_config.read(folder, "SamProcessor.save_pretrained")
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


def pixel_values(pixels: np.ndarray, processing: Processing) -> tuple[np.ndarray, tuple[int, int]]:
    """HWC uint8 RGB -> the encoder's (3, pad_height, pad_width) float32 input and the resized size."""
    height, width = resized_size(pixels.shape[0], pixels.shape[1], processing.longest_edge)
    if height > processing.pad_height or width > processing.pad_width:
        raise ProcessingError(f"the resized image {height}x{width} exceeds the padded size")
    resized = resampling.resize(pixels, height, width, resampling.BILINEAR).astype(np.float32)
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


def bilinear_taps(n_in: int, n_out: int, fused: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch's bilinear resize along one axis (align_corners false, no antialias): each output's two
    source indices and the second one's float32 weight. ``fused``: the source index ``scale * (d + 0.5)
    - 0.5`` rounded once, as torch's CPU kernel computes it on images (a fused multiply-add); else
    rounded at each step, as on masks."""
    scale = np.float32(n_in) / np.float32(n_out)
    centers = np.arange(n_out, dtype=np.float32) + np.float32(0.5)
    if fused:
        source = (centers.astype(np.float64) * np.float64(scale) - 0.5).astype(np.float32)
    else:
        source = scale * centers - np.float32(0.5)
    source = np.maximum(source, np.float32(0))
    low = np.minimum(source.astype(np.int64), n_in - 1)
    high = np.where(low < n_in - 1, low + 1, low)
    return low, high, np.clip(source - low.astype(np.float32), 0, 1).astype(np.float32)


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``bilinear_taps`` (on masks) as an (n_out, n_in) matrix."""
    low, high, upper = bilinear_taps(n_in, n_out)
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
