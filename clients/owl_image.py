"""OWLv2's and OWL-ViT's image processing as pure numpy functions: ``Owlv2ImageProcessor`` and
``OwlViTImageProcessor`` (transformers 5's default, torchvision backend) to ``pixel_values``, and the
boxes of ``post_process_object_detection`` back in the image's pixels.

- OWLv2: rescaled to [0, 1] in float32, padded bottom and right with 0.0 to a square of the longest
  side, blurred by a gaussian when that square is larger than the input (sigma ``(side / size - 1) /
  2``, ``2 * ceil(3 sigma) + 1`` taps, reflected at the borders), resized bilinearly without antialias
  (``clients.sam_image.bilinear_taps``, the source index rounded once as torch's kernel does),
  normalised. The blur is computed only at the rows and columns the resize reads.
- OWL-ViT: resized to the input's size, aspect ratio not kept, bicubic antialiased on uint8
  (``clients.resampling``: torch's integer kernel, the same pixels), rescaled and normalised.
- ``boxes``: the model's (cx, cy, w, h) in [0, 1] to (x0, y0, x1, y1) in the original image's pixels,
  in float32 as the processors compute them: OWLv2 scales each coordinate by the padded square's
  side (the image's longest side), OWL-ViT (and Grounding DINO) by the image's width and height.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core import zsd_contract as contract
from clients import processor_config, resampling, sam_image

OWLV2, OWLVIT = contract.OWLV2, contract.OWLVIT
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLE = {OWLV2: (2, "bilinear"), OWLVIT: (3, "bicubic")}  # PIL's number and name of the processor's filter
DEFAULT_SIZE = {OWLV2: 960, OWLVIT: 768}
ProcessingError = processor_config.ProcessingError


@dataclass(frozen=True)
class Processing:
    """The image processor's settings (``kind``: the model type, ``owlv2`` or ``owlvit``)."""

    kind: str
    height: int
    width: int
    rescale_factor: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def read(cls, folder: Path, kind: str) -> Processing:
        """From a save_pretrained folder; a setting this module does not reproduce is refused, naming the file."""
        path, settings = processor_config.read(folder, f"{kind} processor's save_pretrained")
        for flag in ("do_resize", "do_rescale", "do_normalize", *(("do_pad",) if kind == OWLV2 else ())):
            if settings.get(flag, True) is not True:
                raise ProcessingError(f"{path}: {flag} false is not served")
        number, name = RESAMPLE[kind]
        if settings.get("resample", number) != number:
            raise ProcessingError(f"{path}: resample {settings['resample']} is not served ({number}: {name})")
        try:
            size = settings.get("size") or {"height": DEFAULT_SIZE[kind], "width": DEFAULT_SIZE[kind]}
            height, width = int(size["height"]), int(size["width"])
            crop = settings.get("crop_size") or {"height": height, "width": width}
            if kind == OWLVIT and settings.get("do_center_crop") and (crop["height"], crop["width"]) != (height, width):
                raise ProcessingError(f"{path}: a center crop smaller than size is not served")
            return cls(
                kind=kind,
                height=height,
                width=width,
                rescale_factor=float(settings.get("rescale_factor", 1 / 255)),
                mean=tuple(float(v) for v in settings.get("image_mean", CLIP_MEAN)),
                std=tuple(float(v) for v in settings.get("image_std", CLIP_STD)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ProcessingError(f"{path}: size, image_mean or image_std not readable: {error}") from None

    @property
    def square(self) -> bool:
        """Whether the boxes are scaled by the image's longest side (OWLv2's padded square)."""
        return self.kind == OWLV2

    def pixel_values(self, pixels: np.ndarray) -> np.ndarray:
        """HWC uint8 RGB -> the model's (3, height, width) float32 input, as its processor gives it."""
        return owlv2_pixel_values(pixels, self) if self.kind == OWLV2 else owlvit_pixel_values(pixels, self)


def normalised(values: np.ndarray, mean, std) -> np.ndarray:
    """(C, H, W) float32 -> ``(v - mean) / std`` in float32, as the processor's fused step."""
    mean = np.asarray(mean, dtype=np.float32)[:, None, None]
    std = np.asarray(std, dtype=np.float32)[:, None, None]
    return ((values - mean) / std).astype(np.float32)


def gaussian(taps: int, sigma: float) -> np.ndarray:
    """torchvision's 1-D gaussian kernel, float32."""
    limit = (taps - 1) / (2.0 * math.sqrt(2.0))
    x = np.linspace(-limit, limit, taps, dtype=np.float32)
    exponent = -((x / np.float32(sigma)) ** 2)
    kernel = np.exp(exponent - exponent.max())
    return (kernel / kernel.sum()).astype(np.float32)


def _reflect(index: np.ndarray, n: int) -> np.ndarray:
    index = np.abs(index)
    return np.where(index >= n, 2 * (n - 1) - index, index)


def _sampled(values: np.ndarray, side: int, wanted: np.ndarray, axis: int, kernel: np.ndarray | None) -> np.ndarray:
    """Along ``axis`` of ``values`` (padded with zeros to ``side``), the ``wanted`` indices, blurred by
    ``kernel`` (reflected at the padded square's borders) when there is one."""
    present = values.shape[axis]
    zero = np.zeros_like(np.take(values, [0], axis=axis))
    padded = np.concatenate([values, zero], axis=axis)  # index ``present``: a padding zero
    if kernel is None:
        return np.take(padded, np.minimum(wanted, present), axis=axis)
    radius = len(kernel) // 2
    total = None
    for tap, weight in enumerate(kernel):
        source = _reflect(wanted + tap - radius, side)
        term = weight * np.take(padded, np.where(source < present, source, present), axis=axis)
        total = term if total is None else total + term
    return total.astype(np.float32)


def owlv2_pixel_values(pixels: np.ndarray, processing: Processing) -> np.ndarray:
    """HWC uint8 RGB -> OWLv2's (3, height, width) float32 input."""
    values = pixels.transpose(2, 0, 1).astype(np.float32) * np.float32(processing.rescale_factor)
    side = max(values.shape[1:])
    kernels = []
    for size in (processing.height, processing.width):
        sigma = max((float(np.float32(side) / np.float32(size)) - 1) / 2, 0.0)
        kernels.append(gaussian(2 * math.ceil(3 * sigma) + 1, sigma) if sigma > 0 else None)
    if (kernels[0] is None) != (kernels[1] is None):
        kernels = [k if k is not None else np.ones(1, np.float32) for k in kernels]
    rows = sam_image.bilinear_taps(side, processing.height, fused=True)
    columns = sam_image.bilinear_taps(side, processing.width, fused=True)
    needed_rows, row_at = np.unique(np.concatenate(rows[:2]), return_inverse=True)
    needed_columns, column_at = np.unique(np.concatenate(columns[:2]), return_inverse=True)
    values = _sampled(values, side, needed_columns, 2, kernels[1])
    values = _sampled(values, side, needed_rows, 1, kernels[0])
    n_rows, n_columns = processing.height, processing.width
    low, high = column_at[:n_columns], column_at[n_columns:]
    right = columns[2]
    values = values[:, :, low] * (np.float32(1) - right) + values[:, :, high] * right
    low, high = row_at[:n_rows], row_at[n_rows:]
    down = rows[2][:, None]
    values = values[:, low] * (np.float32(1) - down) + values[:, high] * down
    return normalised(values.astype(np.float32), processing.mean, processing.std)


def owlvit_pixel_values(pixels: np.ndarray, processing: Processing) -> np.ndarray:
    """HWC uint8 RGB -> OWL-ViT's (3, height, width) float32 input."""
    resized = resampling.resize(pixels, processing.height, processing.width, resampling.BICUBIC)
    scale = 1.0 / processing.rescale_factor
    mean = [m * scale for m in processing.mean]
    std = [s * scale for s in processing.std]
    return normalised(resized.transpose(2, 0, 1).astype(np.float32), mean, std)


def boxes(found: np.ndarray, height: int, width: int, square: bool = False) -> np.ndarray:
    """(N, 4) (cx, cy, w, h) in [0, 1] -> (N, 4) (x0, y0, x1, y1) float32 in the image's pixels, scaled by
    the image's width and height (OWL-ViT, Grounding DINO) or, ``square``, by its longest side (OWLv2)."""
    found = np.asarray(found, dtype=np.float32)
    cx, cy, w, h = found.T
    half = np.float32(0.5)
    corners = np.stack([cx - half * w, cy - half * h, cx + half * w, cy + half * h], axis=-1)
    if square:
        scale = np.full(4, max(height, width), dtype=np.float32)
    else:
        scale = np.array([width, height, width, height], dtype=np.float32)
    return corners * scale
