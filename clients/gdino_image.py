"""Grounding DINO's image processing as pure numpy functions: ``GroundingDinoImageProcessor``
(transformers 5's default, torchvision backend) to ``pixel_values``.

The image is resized keeping its aspect ratio (``target_size``: the shortest side to ``shortest_edge``
unless the longest side would pass ``longest_edge``, as ``get_size_with_aspect_ratio`` rounds them)
with torch's antialiased bilinear kernel on uint8 (``clients.resampling``: the same pixels), then
rescaled and normalised in float32. One image needs no padding: its ``pixel_mask`` is all ones. The
boxes come back as OWL-ViT's do (``clients.owl_image.boxes``: by the image's width and height).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients import owl_image, processor_config, resampling

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ProcessingError = processor_config.ProcessingError


def target_size(height: int, width: int, shortest_edge: int, longest_edge: int) -> tuple[int, int]:
    """``transformers.image_transforms.get_size_with_aspect_ratio((height, width), shortest_edge, longest_edge)``."""
    size, raw = shortest_edge, None
    low, high = float(min(height, width)), float(max(height, width))
    if high / low * size > longest_edge:
        raw = longest_edge * low / high
        size = int(round(raw))
    if (height <= width and height == size) or (width <= height and width == size):
        return height, width
    if width < height:
        return (int(raw * height / width) if raw is not None else int(size * height / width)), size
    return size, (int(raw * width / height) if raw is not None else int(size * width / height))


@dataclass(frozen=True)
class Processing:
    """``GroundingDinoImageProcessor``'s settings."""

    shortest_edge: int
    longest_edge: int
    rescale_factor: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    square = False  # boxes scaled by the image's width and height

    @classmethod
    def read(cls, folder: Path) -> Processing:
        """From a save_pretrained folder; a setting this module does not reproduce is refused, naming the file."""
        path, settings = processor_config.read(folder, "GroundingDinoProcessor.save_pretrained")
        for flag in ("do_resize", "do_rescale", "do_normalize"):
            if settings.get(flag, True) is not True:
                raise ProcessingError(f"{path}: {flag} false is not served")
        if settings.get("resample", 2) != 2:
            raise ProcessingError(f"{path}: resample {settings['resample']} is not served (2: bilinear)")
        try:
            size = settings.get("size") or {"shortest_edge": 800, "longest_edge": 1333}
            return cls(
                shortest_edge=int(size["shortest_edge"]),
                longest_edge=int(size["longest_edge"]),
                rescale_factor=float(settings.get("rescale_factor", 1 / 255)),
                mean=tuple(float(v) for v in settings.get("image_mean", IMAGENET_MEAN)),
                std=tuple(float(v) for v in settings.get("image_std", IMAGENET_STD)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ProcessingError(
                f"{path}: size (shortest_edge, longest_edge), image_mean or image_std: {error}"
            ) from None

    def pixel_values(self, pixels: np.ndarray) -> np.ndarray:
        """HWC uint8 RGB -> the model's (3, h, w) float32 input, its size ``target_size``."""
        height, width = target_size(pixels.shape[0], pixels.shape[1], self.shortest_edge, self.longest_edge)
        resized = resampling.resize(pixels, height, width, resampling.BILINEAR)
        scale = 1.0 / self.rescale_factor
        return owl_image.normalised(
            resized.transpose(2, 0, 1).astype(np.float32), [m * scale for m in self.mean], [s * scale for s in self.std]
        )
