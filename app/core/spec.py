"""A model's one description: ``models/<name>/model.toml``.

The model-preparation script writes ``config.pbtxt`` and the artifact from it; the router
reads the family, the pre- and post-processing settings and the tensor contract from it.
Nothing here imports more than the standard library and numpy, so both sides can use it.

A file is read with the families it may name (``app.core.family``): a family completes a two-line
model.toml from its Hugging Face folder and says where its pipeline runs. ``clients.families``
reads with the served families (``load_spec``, ``find_specs``); so does everything above it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.core.family import Family
from app.core.pipeline import ROUTER, pipeline_of
from app.core.text_spec import SOURCE_KEY, TextModel, TextSpecError, is_text_spec

SPEC_FILE = "model.toml"

# Triton's data type names (config.pbtxt spells them TYPE_<name>) and their numpy twins: the one
# table (clients.v2_checks adds BF16 and BYTES, which numpy has no twin for).
TRITON_TO_NUMPY: Mapping[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}


class SpecError(ValueError):
    """A model.toml that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # Triton's name: FP32, INT64, UINT8, ...
    dims: tuple[int, ...]  # without the batch dimension

    @property
    def numpy_dtype(self) -> np.dtype:
        return TRITON_TO_NUMPY[self.dtype]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    folder: Path
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    description: str = ""
    max_queue_delay_microseconds: int = 0
    # [instances]: given counts, each 0 for "auto" (the default: serve sizes it for the machine, app.core.sizing)
    instance_count: int = 0  # the network's instances (on each GPU where it runs on GPUs)
    threads: int = 0  # the network's ONNX Runtime intra-op threads per instance (on the CPU)
    preprocess_instances: int = 0  # the preprocessing step's instances (DALI: copies on each GPU)
    preprocess_threads: int = 0  # DALI's num_threads per copy
    export: Mapping[str, Any] = field(default_factory=dict)
    preprocess: Mapping[str, Any] = field(default_factory=dict)
    postprocess: Mapping[str, Any] = field(default_factory=dict)
    pipeline: str = ROUTER  # where pre- and post-processing run: app.core.pipeline (TRITON or ROUTER)
    # A required model that is not ready makes /ping unhealthy; an optional one only answers 503 (app.core.health).
    required: bool = True
    # The network's name in Triton (its pipeline's steps are named after it): the folder's name,
    # which is ``name`` except where a multi-model endpoint loads the model under a name of its own.
    triton_name: str = ""
    # A text family's Hugging Face folder and what was read from it (app.core.text_spec); None otherwise.
    text: TextModel | None = None

    def __post_init__(self) -> None:
        if not self.triton_name:
            object.__setattr__(self, "triton_name", self.name)

    def file(self, relative: str) -> Path:
        """A file named in the spec, relative to the model's folder."""
        return self.folder / relative


def _tensors(raw: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{where}: needs at least one [[...]] table")
    tensors = []
    for i, item in enumerate(raw):
        try:
            dtype = str(item["dtype"]).upper()
            if dtype not in TRITON_TO_NUMPY:
                raise SpecError(f"{where}[{i}].dtype {dtype!r} is not one of {sorted(TRITON_TO_NUMPY)}")
            dims = tuple(int(d) for d in item["dims"])
            tensors.append(TensorSpec(name=str(item["name"]), dtype=dtype, dims=dims))
        except KeyError as missing:
            raise SpecError(f"{where}[{i}] has no {missing.args[0]!r}") from None
    return tuple(tensors)


# [instances] keys -> ModelSpec fields; each "auto" (the default) or a whole number of at least 1.
INSTANCE_KEYS: Mapping[str, str] = {
    "count": "instance_count",
    "threads": "threads",
    "preprocess": "preprocess_instances",
    "preprocess_threads": "preprocess_threads",
}
AUTO = "auto"


def _instances(raw: Any, where: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be a table")
    unknown = sorted(set(raw) - set(INSTANCE_KEYS))
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(INSTANCE_KEYS)})")
    counts = {}
    for key, value in raw.items():
        if value == AUTO:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{where} {key} = {value!r}: expected {AUTO!r} or a whole number of at least 1")
        counts[INSTANCE_KEYS[key]] = value
    return counts


def read_spec(folder: str | Path, families: Mapping[str, Family]) -> ModelSpec:
    """Read ``<folder>/model.toml``, completed by its family where it names a folder to read; the
    folder's name is the model's name. A family not in ``families`` is read as it is (the clients'
    table refuses it, naming the families it has)."""
    folder = Path(folder)
    path = folder / SPEC_FILE
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: {e}") from None
    text = None
    family = families.get(str(raw.get("family", "")))
    if family is not None and family.chains and family.complete is not None:
        try:
            raw, text = family.complete(raw, folder, str(path))
        except TextSpecError as error:
            raise SpecError(str(error)) from None
    elif is_text_spec(raw):
        completing = [name for name, each in families.items() if each.complete is not None]
        if family is None or family.complete is None:
            raise SpecError(
                f"{path}: [export] {SOURCE_KEY} serves the families {', '.join(completing)}, "
                f"not {str(raw.get('family', ''))!r}"
            )
        try:
            raw, text = family.complete(raw, folder, str(path))
        except TextSpecError as error:
            raise SpecError(str(error)) from None
    for key in ("family", "max_batch_size"):
        if key not in raw:
            raise SpecError(f"{path}: missing {key!r}")
    try:
        triton = [name for name, each in families.items() if each.triton_pipeline]
        pipeline = pipeline_of(raw, str(raw["family"]), family.pipelines if family else (ROUTER,), triton, str(path))
    except ValueError as error:
        raise SpecError(str(error)) from None
    required = raw.get("required", True)
    if not isinstance(required, bool):
        raise SpecError(f"{path}: required must be true or false, not {required!r}")
    return ModelSpec(
        name=folder.name,
        family=str(raw["family"]),
        folder=folder,
        description=str(raw.get("description", "")),
        max_batch_size=int(raw["max_batch_size"]),
        inputs=_tensors(raw.get("inputs"), f"{path}: inputs"),
        outputs=_tensors(raw.get("outputs"), f"{path}: outputs"),
        max_queue_delay_microseconds=int(raw.get("batching", {}).get("max_queue_delay_microseconds", 0)),
        **_instances(raw.get("instances", {}), f"{path}: [instances]"),
        export=dict(raw.get("export", {})),
        preprocess=dict(raw.get("preprocess", {})),
        postprocess=dict(raw.get("postprocess", {})),
        pipeline=pipeline,
        required=required,
        text=text,
    )


def read_specs(repository: str | Path, families: Mapping[str, Family]) -> dict[str, ModelSpec]:
    """Every model folder of a repository that carries a model.toml, by name."""
    repository = Path(repository)
    return {
        folder.name: read_spec(folder, families)
        for folder in sorted(repository.iterdir())
        if folder.is_dir() and (folder / SPEC_FILE).is_file()
    }
