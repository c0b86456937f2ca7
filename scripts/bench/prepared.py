"""A generation benchmark's one model, prepared into the repository its stack serves
(``scripts.bench.generation``, ``scripts.bench.chat``): its source written by the benchmark's own
builder under ``out/models`` (``out/models-small`` for ``--small``), prepared by ``scripts.model_prep``
with the ONNX export cached in ``out/cache`` (a second run exports nothing)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.core.spec import ModelSpec
from clients.families import load_spec


def sources(out: Path, small: bool) -> Path:
    """Where the model's source (model.toml and Hugging Face folder) is written."""
    return out / ("models-small" if small else "models")


def prepare_repository(
    out: Path, repository: Path, model: str, seed: int, small: bool, source: Callable[[Path, bool], Path]
) -> Path:
    """``source(models, small)`` writes the model's source (unless there); it is prepared into ``repository``."""
    from scripts.model_prep import cli

    models = sources(out, small)
    source(models, small)
    repository.mkdir(parents=True, exist_ok=True)
    argv = ["--source", str(models), "--repository", str(repository), "--cache-dir", str(out / "cache")]
    argv += ["--models", model, "--weights", "pretrained", "--seed", str(seed)]
    if cli.main(argv) != 0:
        raise SystemExit(f"python -m scripts.model_prep {' '.join(argv)} failed (its error is above)")
    return repository


def ready(out: Path, repository: Path, model: str, small: bool, build: Callable[[], object] | None) -> ModelSpec:
    """The served model's spec, its repository prepared first by ``build`` (None: served as it is);
    a clear stop when the repository lacks it."""
    out.mkdir(parents=True, exist_ok=True)
    if build is not None:
        print(f"preparing {repository} ({'small' if small else 'realistic'} model) ...", flush=True)
        build()
    if not (repository / model / "model.toml").is_file():
        raise SystemExit(f"{repository} lacks {model}: run without --no-prepare")
    return load_spec(repository / model)


def kept_or_built(model: Path, build: str, what: str, make: Callable[[Path], Path]) -> None:
    """``model/hf`` made by ``make`` unless its ``BUILD`` stamp says it was made from ``build`` (the
    builder's settings) and its weights are there: a second run builds nothing."""
    stamp = model / "BUILD"
    if not stamp.is_file() or stamp.read_text() != build or not (model / "hf" / "model.safetensors").is_file():
        print(f"building {model / 'hf'} ({what}) ...")
        make(model / "hf")
        stamp.write_text(build)
