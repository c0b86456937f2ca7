"""The zero_shot_object_detection family's small models (its ``small``): a tiny OWLv2 or OWL-ViT
(``scripts.model_prep.small_models.owl``) or Grounding DINO (``scripts.model_prep.small_models.gdino``),
by ``kind``."""

from __future__ import annotations

from pathlib import Path

from scripts.model_prep.small_models.gdino import gdino_model_folder
from scripts.model_prep.small_models.owl import owl_model_folder

GROUNDING_DINO_KIND = "grounding-dino"


def zero_shot_folder(models: Path, name: str, kind: str = "owlv2", **options) -> Path:
    """``<models>/<name>/``: a tiny detector of ``kind``, ``owlv2``, ``owlvit`` or ``grounding-dino``."""
    if kind == GROUNDING_DINO_KIND:
        return gdino_model_folder(models, name, **options)
    return owl_model_folder(models, name, kind=kind, **options)
