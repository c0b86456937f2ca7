"""What the exports of several checked graphs served by one python-backend model share (SAM's two
graphs, a zero-shot detector's one): the graphs' one digest, the cache of a checked export, the
comparison with torch, and the version folder."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from scripts.model_prep.onnx_export import OPSET, REPORT_FILE, ExportError, sha256_of
from scripts.model_prep.recipes import Tolerance


def digest(folder: Path, files: Sequence[str]) -> str:
    """One sha256 of the graphs (source.json's ``onnx_sha256``)."""
    found = hashlib.sha256()
    for name in files:
        found.update(name.encode() + bytes.fromhex(sha256_of(folder / name)))
    return found.hexdigest()


def cached(folder: Path, files: Sequence[str]) -> dict | None:
    """The report of a checked export in ``folder``, when its graphs are those it checked."""
    report = folder / REPORT_FILE
    if not report.is_file() or not all((folder / name).is_file() for name in files):
        return None
    found = json.loads(report.read_text())
    return found if found.get("opset") == OPSET and found.get("onnx_sha256") == digest(folder, files) else None


def difference(name: str, reference, found: np.ndarray, tolerance: Tolerance, diffs: dict, limits: dict) -> None:
    """``diffs[name]``: the largest |torch - ONNX Runtime| seen under that name; ``limits[name]`` its tolerance."""
    reference = np.asarray(reference, dtype=np.float64)
    if reference.shape != found.shape:
        raise ExportError(f"ONNX Runtime gives {name} the shape {list(found.shape)}, torch {list(reference.shape)}")
    diffs[name] = max(diffs.get(name, 0.0), float(np.max(np.abs(reference - found.astype(np.float64)))))
    limits[name] = min(limits.get(name, np.inf), tolerance.limit(reference))


def refuse_beyond(model: str, diffs: dict, limits: dict) -> None:
    failed = [f"{n}: {diffs[n]:.3g} > {limits[n]:.3g}" for n in diffs if not diffs[n] <= limits[n]]
    if failed:
        raise ExportError(f"[{model}] ONNX Runtime differs from torch beyond the tolerance: " + "; ".join(failed))


def keep(partial: Path, cache: Path, files: Sequence[str], diffs: dict, limits: dict) -> dict:
    """The checked graphs moved from ``partial`` into ``cache``, with their report."""
    for name in files:
        (partial / name).replace(cache / name)
    partial.rmdir()
    report = {"opset": OPSET, "onnx_sha256": digest(cache, files), "max_abs_diff": diffs, "tolerance": limits}
    (cache / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def write_version(version: Path, cache: Path, link, graphs: bool, files: Sequence[str], model_py: Path) -> None:
    """The version folder: the graphs (not with ``graphs`` False: --config-only) and the python-backend
    model that serves them."""
    version.mkdir(parents=True, exist_ok=True)
    for stale in ("model.onnx", "model.plan"):
        (version / stale).unlink(missing_ok=True)
    for name in files if graphs else ():
        link(cache / name, version / name)
    shutil.copyfile(model_py, version / "model.py")


def export_checked(
    spec, choice, cache: Path, reexport: bool, step, files: Sequence[str], load: Callable, what: str, export, check
) -> dict:
    """The checked graphs ``files`` of (model, weights) in ``cache`` and their report: from the cache
    when there (not with ``reexport``), else ``load()`` (the model and its processor), ``export(loaded,
    partial)`` ("exporting ``what`` to ONNX"), ``check(loaded, partial)`` (its diffs and limits; refuses
    past them), each a step of the output, and the graphs kept."""
    hit = None if reexport else cached(cache, files)
    if hit:
        print(f"[{spec.name}] ONNX export ({choice.describe()}) from the cache: {cache}", flush=True)
        return hit
    with step(spec.name, f"loading the model ({choice.describe()})"):
        loaded = load()
    partial = cache / "partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with step(spec.name, f"exporting {what} to ONNX"):
        export(loaded, partial)
    with step(spec.name, "checking the export (onnx.checker, pixel_values, ONNX Runtime vs torch)"):
        diffs, limits = check(loaded, partial)
    return keep(partial, cache, files, diffs, limits)
