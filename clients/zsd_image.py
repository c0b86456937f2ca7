"""A zero-shot detector's image processing, by its model type: OWLv2's and OWL-ViT's
(``clients.owl_image``) or Grounding DINO's (``clients.gdino_image``). Each has ``pixel_values(pixels)``
and ``square`` (whether ``owl_image.boxes`` scales by the longest side)."""

from __future__ import annotations

from pathlib import Path

from app.core import zsd_contract as contract
from clients import gdino_image, owl_image, processor_config

ProcessingError = processor_config.ProcessingError


def read(folder: Path, model_type: str):
    """The processing of the folder's processor config; one not reproduced is a ProcessingError naming the file."""
    if model_type == contract.GROUNDING_DINO:
        return gdino_image.Processing.read(folder)
    return owl_image.Processing.read(folder, model_type)
