"""Small models as a multi-model endpoint loads them: a model prepared in place and packaged by
``package-models --per-model``, then extracted where SageMaker would put it. Used by the multi-model
tests and ``python -m scripts.soak.model_cycles``."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path


def export_cache(cache: Path, start: Path | None = None, names=()) -> Path:
    """An ONNX export cache of one's own (model preparation writes into it), started with ``start``'s
    exports of the models ``names`` (the small models' cache: the same weights are not exported again)."""
    for name in names if start else ():
        if (start / "onnx" / name).is_dir() and not (cache / "onnx" / name).exists():
            shutil.copytree(start / "onnx" / name, cache / "onnx" / name)
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def multi_model_archive(models: Path, name: str, target: Path, cache: Path | None = None) -> tuple[set[str], Path]:
    """``models/<name>`` prepared in place under ``target`` and packaged as a multi-model endpoint
    takes it: the archive's member names, and the folder it is extracted to (``cache``: an export cache
    to start from)."""
    from scripts.model_prep import cli
    from scripts.sagemaker import package_models

    source = target / "models"
    shutil.copytree(models / name, source / name)
    own = export_cache(target / "cache", cache, [name])
    if cli.main(["--source", str(source), "--cache-dir", str(own)]) != 0:  # in place
        raise RuntimeError(f"model preparation of {models / name} failed")
    files = package_models.validate(source)
    [archive] = package_models.write_per_model(source, package_models.per_model(source, files), target, log=print)
    with tarfile.open(archive) as tar:
        tar.extractall(target / "extracted" / "model", filter="data")
        return set(tar.getnames()), target / "extracted" / "model"
