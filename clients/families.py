"""Model families by name, and the registry of served models built from a repository's specs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.settings import Settings
from app.core.spec import ModelSpec, SpecError, find_specs
from clients.base import ModelClient, Triton
from clients.classification import ImageClassificationClient
from clients.detection import DetectionClient
from clients.fill_mask import FillMaskClient
from clients.sentence_embedding import SentenceEmbeddingClient
from clients.text2text import Text2TextClient
from clients.text_classification import TextClassificationClient
from clients.token_classification import TokenClassificationClient

FAMILIES: Mapping[str, type[ModelClient]] = {
    cls.family: cls
    for cls in (
        ImageClassificationClient,
        DetectionClient,
        FillMaskClient,
        TextClassificationClient,
        TokenClassificationClient,
        SentenceEmbeddingClient,
        Text2TextClient,
    )
}


class _NoTriton:
    """The Triton of a client that is only asked to pre- or post-process."""

    def infer(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError("this client only pre- and post-processes: it does not call Triton")


def offline_client(spec: ModelSpec, settings: Settings) -> ModelClient:
    """The model's family client, without Triton: for the pipeline's python steps (which run inside
    Triton) and the benchmark's tensors."""
    return FAMILIES[spec.family].of(spec)(spec, _NoTriton(), settings)


def make_client(spec: ModelSpec, triton: Triton, settings: Settings) -> ModelClient:
    """The client of the model's family; an unknown family is a SpecError naming the file."""
    family = FAMILIES.get(spec.family)
    if family is None:
        raise SpecError(f"{spec.folder}: family {spec.family!r} is not one of {sorted(FAMILIES)}")
    return family.of(spec)(spec, triton, settings)


def check_specs(repository: str | Path, settings: Settings) -> None:
    """Every model.toml of the repository read as its family reads it (options, labels, tokenizer),
    with no Triton: a mistake is a SpecError naming the file and the key, before anything starts."""
    for spec in find_specs(repository).values():
        make_client(spec, _NoTriton(), settings)


def build_registry(repository: str | Path, triton: Triton, settings: Settings) -> dict[str, ModelClient]:
    """One client per model folder with a model.toml; an unknown family stops the start-up."""
    return {name: make_client(spec, triton, settings) for name, spec in find_specs(repository).items()}
