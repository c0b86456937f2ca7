"""The families, in one table, and what reads with them: a model folder's spec and its client.

Each family is one object (``app.core.family.Family``) at the end of its own module; ``FAMILIES``
lists them, by name, as Hugging Face's ``SUPPORTED_TASKS`` lists its tasks. Adding a family is one
module and one line in ``BUILT_IN``, or, for a family of one's own outside this tree, its module
named in ``FAMILY_MODULES`` (read once, at import, by every process that serves or prepares models).
The router, the sizing, model preparation and the Triton steps ask a family's object what it does
(``family_of(spec)``), never its name; only the small-model builders and the text benchmark's rows,
which are about named families, still name them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.family import Family
from app.core.settings import FAMILY_MODULES, Settings
from app.core.spec import ModelSpec, SpecError, read_spec, read_specs
from clients import (
    classification,
    detection,
    fill_mask,
    grounded_segmentation,
    mask_generation,
    sentence_embedding,
    text2text,
    text_classification,
    text_generation,
    token_classification,
    zero_shot_detection,
)
from clients.base import ModelClient, Triton

BUILT_IN: tuple[Family, ...] = (
    classification.FAMILY,
    detection.FAMILY,
    text_classification.FAMILY,
    token_classification.FAMILY,
    sentence_embedding.FAMILY,
    fill_mask.FAMILY,
    text2text.FAMILY,
    text_generation.FAMILY,
    mask_generation.FAMILY,
    zero_shot_detection.FAMILY,
    grounded_segmentation.FAMILY,
)


def registered(modules: str) -> tuple[Family, ...]:
    """The families of ``FAMILY_MODULES``: each module's ``FAMILY``. A module that cannot be imported,
    or has no Family, stops the process with a message naming it (a typo is not a family gone quietly)."""
    found = []
    for name in filter(None, (part.strip() for part in modules.split(","))):
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            raise SpecError(f"{FAMILY_MODULES}: module {name!r} cannot be imported: {error}") from None
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            raise SpecError(f"{FAMILY_MODULES}: module {name!r} has no FAMILY = Family(...)")
        found.append(family)
    return tuple(found)


def table(families: tuple[Family, ...]) -> dict[str, Family]:
    """The families by name; two of one name is a mistake, named."""
    by_name: dict[str, Family] = {}
    for family in families:
        if family.name in by_name:
            raise SpecError(f"two families are named {family.name!r} ({FAMILY_MODULES}: {family.client.__module__})")
        by_name[family.name] = family
    return by_name


# The built-in families, then those of FAMILY_MODULES.
FAMILIES: Mapping[str, Family] = table((*BUILT_IN, *registered(os.environ.get(FAMILY_MODULES, ""))))


def load_spec(folder: str | Path, families: Mapping[str, Family] = FAMILIES) -> ModelSpec:
    """``<folder>/model.toml`` read and completed by its family (``app.core.spec.read_spec``)."""
    return read_spec(folder, families)


def find_specs(repository: str | Path, families: Mapping[str, Family] = FAMILIES) -> dict[str, ModelSpec]:
    """Every model folder of a repository that carries a model.toml, by name, read as ``load_spec`` reads it."""
    return read_specs(repository, families)


def family_of(spec: ModelSpec, families: Mapping[str, Family] = FAMILIES) -> Family:
    """The spec's family; an unknown family is a SpecError naming the file and the families there are."""
    family = families.get(spec.family)
    if family is None:
        raise SpecError(f"{spec.folder}: family {spec.family!r} is not one of {sorted(families)}")
    return family


class _NoTriton:
    """The Triton of a client that is only asked to pre- or post-process."""

    def infer(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError("this client only pre- and post-processes: it does not call Triton")


def offline_client(spec: ModelSpec, settings: Settings) -> ModelClient:
    """The model's family client, without Triton: for the pipeline's python steps (which run inside
    Triton) and the benchmark's tensors."""
    return make_client(spec, _NoTriton(), settings)


def make_client(
    spec: ModelSpec, triton: Triton, settings: Settings, families: Mapping[str, Family] = FAMILIES
) -> ModelClient:
    """The client of the model's family; an unknown family is a SpecError naming the file."""
    return family_of(spec, families).client.of(spec)(spec, triton, settings)


def check_specs(repository: str | Path, settings: Settings, families: Mapping[str, Family] = FAMILIES) -> None:
    """Every model.toml of the repository read as its family reads it (options, labels, tokenizer),
    with no Triton: a mistake is a SpecError naming the file and the key, before anything starts."""
    for spec in find_specs(repository, families).values():
        make_client(spec, _NoTriton(), settings, families)


def build_registry(
    repository: str | Path, triton: Triton, settings: Settings, families: Mapping[str, Family] = FAMILIES
) -> dict[str, ModelClient]:
    """One client per model folder with a model.toml; an unknown family stops the start-up."""
    return {
        name: make_client(spec, triton, settings, families) for name, spec in find_specs(repository, families).items()
    }
