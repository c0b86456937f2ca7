"""What model preparation does to one model: write the data files the router needs (labels,
vocabulary), get the weights (pretrained, a user's file, or seeded random), export and check ONNX
(cached under build/onnx), then write ``config.pbtxt`` and the target's artifact into
``<repository>/<model>/1/``. A model whose model.toml says ``[export] onnx = "model.onnx"`` brings its
own ONNX file (and data files): it is checked and written the same way, without an export.

``STEPS`` is what a family's own export (``Family.export``) is handed; ``scripts.model_prep.cli`` runs
them for each model of the command line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from app.triton import ONNX_MODEL
from scripts.model_prep.arguments import Options

VERSION = "1"
DATA_KEYS = ("labels", "vocab")  # spec settings that name a file the router reads
ONNX_KEY = "onnx"  # [export] onnx = "model.onnx": the user's own ONNX file, in the model's folder


@contextmanager
def step(model: str, text: str):
    """Print ``[model] text ... 1.2 s`` around a long step."""
    print(f"[{model}] {text} ...", end="", flush=True)
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        print(" failed", flush=True)
        raise
    print(f" {time.perf_counter() - started:.1f} s", flush=True)


def choose_weights(spec, recipe, options: Options, probe=None):
    """What weights to use; pretrained falls back to random (loudly) when its host is unreachable."""
    from scripts.model_prep import weights

    probe = probe or weights.probe
    if spec.name in options.weights_files:
        return weights.WeightsChoice(weights.FILE, options.seed, options.weights_files[spec.name])
    if options.weights in (weights.RANDOM, weights.SMALL):
        return weights.WeightsChoice(options.weights, options.seed)
    with step(spec.name, "probing the pretrained weights' host"):
        reason = probe(recipe.pretrained_url)
    if reason is None:
        return weights.WeightsChoice(weights.PRETRAINED, options.seed)
    weights.warn_fallback(spec.name, reason, options.seed)
    return weights.WeightsChoice(weights.RANDOM, options.seed, reason=reason)


def load_module(spec, recipe, choice, options: Options):
    """The torch module for ``choice``; a failed pretrained download falls back to random."""
    import torch

    from scripts.model_prep import weights

    if choice.source == weights.PRETRAINED:
        try:
            with step(spec.name, "loading pretrained weights"):
                return recipe.pretrained(spec, options.cache_dir / "downloads"), choice
        except (OSError, RuntimeError, ValueError) as error:
            reason = f"download failed: {error.__class__.__name__}: {error}"
            weights.warn_fallback(spec.name, reason, options.seed)
            choice = weights.WeightsChoice(weights.RANDOM, options.seed, reason=reason)
    if choice.source == weights.FILE:
        with step(spec.name, f"loading {choice.describe()}"):
            return recipe.from_file(spec, choice.path), choice
    with step(spec.name, f"building the model ({choice.describe()})"):
        torch.manual_seed(choice.seed)
        return (recipe.small if choice.source == weights.SMALL else recipe.random)(spec), choice


def ensure_onnx(spec, recipe, choice, options: Options):
    """The checked ONNX export for (model, weights), from the cache when it is there."""
    import numpy as np

    from scripts.model_prep import onnx_export

    hit = _cache_hit(spec, choice, options)
    if hit:
        return hit, choice
    module, choice = load_module(spec, recipe, choice, options)
    hit = _cache_hit(spec, choice, options)
    if hit:
        return hit, choice
    folder = options.cache_dir / "onnx" / spec.name / choice.cache_key
    partial = folder / "partial.onnx"
    sample = recipe.sample_inputs(spec, 1, np.random.default_rng(choice.seed))
    with step(spec.name, f"exporting ONNX ({choice.describe()})"):
        onnx_export.export(module, spec, sample, partial)
    with step(
        spec.name,
        f"checking the export (onnx.checker, tensors, ONNX Runtime vs torch at batch {onnx_export.CHECK_BATCH})",
    ):
        diffs, limits = onnx_export.check(partial, spec, recipe, module, choice.seed)
    final = partial.replace(folder / onnx_export.ONNX_FILE)
    result = onnx_export.ExportResult(final, onnx_export.sha256_of(final), diffs, limits, cached=False)
    onnx_export.save_report(folder, result, _weights_record(choice))
    return result, choice


def _cache_hit(spec, choice, options: Options):
    from scripts.model_prep import onnx_export

    if options.reexport:
        return None
    hit = onnx_export.cached(options.cache_dir / "onnx" / spec.name / choice.cache_key, spec)
    if hit:
        print(f"[{spec.name}] ONNX export ({choice.describe()}) from the cache: {hit.path}", flush=True)
    return hit


def _weights_record(choice) -> dict:
    return {
        "weights": choice.source,
        "seed": choice.seed if choice.source in ("random", "small") else None,
        "path": str(choice.path) if choice.path else None,
        "reason": choice.reason or None,
    }


def tuning_for(spec, options: Options):
    from scripts.model_prep.triton_config import Tuning

    def pick(table: dict[str, int], default: int) -> int:
        return table.get(spec.name, table.get("*", default))

    return Tuning(
        # a model without a batch axis (max_batch_size 0: its tensors' dims have none) is given none
        max_batch_size=pick(options.max_batch_size, spec.max_batch_size) if spec.max_batch_size else 0,
        max_queue_delay_microseconds=pick(options.max_queue_delay_us, spec.max_queue_delay_microseconds),
        instance_count=pick(options.instance_count, spec.instance_count),
        ort_threads=options.ort_threads or spec.threads,
    )


def link_or_copy(source: Path, destination: Path) -> None:
    """Hard-link (no second copy of a large file) where the file system allows, else copy."""
    if destination.exists() and destination.samefile(source):
        return
    destination.unlink(missing_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def write_artifact(spec, options: Options, export, tuning) -> Path | None:
    """The target's artifact in the version folder; returns the ONNX file it was made from (None
    with --config-only)."""
    from scripts.model_prep import detector_graph, tensorrt_engine
    from scripts.model_prep.triton_config import ARTIFACT, PYTHON, TENSORRT

    version = options.repository / spec.name / VERSION
    version.mkdir(parents=True, exist_ok=True)
    keep = {ARTIFACT[options.target]} | ({"model.py"} if options.target == PYTHON else set())
    for stale in ({"model.py"} | set(ARTIFACT.values())) - keep:
        (version / stale).unlink(missing_ok=True)
    if options.target == PYTHON:
        shutil.copyfile(ONNX_MODEL, version / "model.py")
    if options.config_only:
        return None
    network = export.path
    if detector_graph.appends(spec):  # NMS and box scaling join the graph, for every target
        network = options.cache_dir / "onnx" / spec.name / f"served-{export.sha256[:16]}-b{tuning.max_batch_size}.onnx"
        with step(spec.name, f"appending the postprocessing to the graph ({tuning.max_batch_size} NMS slots)"):
            detector_graph.append(export.path, spec, tuning.max_batch_size, network)
    if options.target == TENSORRT:
        with step(spec.name, f"building the TensorRT engine ({options.precision}, batch 1..{tuning.max_batch_size})"):
            tensorrt_engine.build_engine(
                network,
                version / ARTIFACT[TENSORRT],
                spec,
                tuning.max_batch_size,
                options.precision,
                options.cache_dir / "tensorrt" / "timing.cache",
            )
    else:
        link_or_copy(network, version / ARTIFACT[options.target])
    return network


def write_model_files(spec, options: Options, export, choice, tuning, served: Path | None = None) -> None:
    """config.pbtxt, source.json (``served``: the ONNX file the artifact was made from, when it is not
    the export: a detector's graph with its postprocessing) and the model's own files."""
    from scripts.model_prep import onnx_export, triton_config

    folder = options.repository / spec.name
    config = triton_config.model_config(spec, options.target, tuning, choice.source)
    (folder / "config.pbtxt").write_text(triton_config.to_text(config))
    record = {
        "model": spec.name,
        "target": options.target,
        "builder": spec.export.get("builder"),
        **({ONNX_KEY: str(spec.export[ONNX_KEY])} if ONNX_KEY in spec.export else {}),
        **_weights_record(choice),
        "onnx_sha256": onnx_export.sha256_of(served) if served and served != export.path else export.sha256,
        **({"network_onnx_sha256": export.sha256} if served and served != export.path else {}),
        "max_abs_diff": export.max_abs_diff,
        "tolerance": export.tolerance,
        "tuning": asdict(tuning),
    }
    (folder / "source.json").write_text(json.dumps(record, indent=2) + "\n")
    if folder.resolve() != spec.folder.resolve():
        for name in ["model.toml", *_data_file_names(spec)]:
            shutil.copyfile(spec.file(name), folder / name)
        if spec.text is not None:
            from scripts.model_prep import transformers_export

            transformers_export.copy_router_files(spec, folder)


def write_pipeline(spec, options: Options, tuning) -> None:
    """The Triton pipeline's steps and ensemble, for a model whose pre- and post-processing run there."""
    from app.core.pipeline import TRITON
    from scripts.model_prep import pipeline_config

    if spec.pipeline != TRITON:
        pipeline_config.remove_pipeline(spec, options.repository)
        return
    names = pipeline_config.write_pipeline(spec, options.repository, options.target, tuning)
    print(f"[{spec.name}] wrote its Triton pipeline: {', '.join(names)}", flush=True)


def _data_file_names(spec) -> list[str]:
    settings = {**spec.preprocess, **spec.postprocess}
    return [str(settings[key]) for key in DATA_KEYS if key in settings]


def prepare(spec, recipe, options: Options, choice=None) -> dict:
    """One model from its recipe; ``choice``: its weights, when the recipe's model does not choose them
    (a text model's folder)."""
    with step(spec.name, "writing data files"):
        recipe.data_files(spec)
    choice = choice or choose_weights(spec, recipe, options)
    export, choice = ensure_onnx(spec, recipe, choice, options)
    diffs = ", ".join(
        f"{n} {export.max_abs_diff[n]:.2e} (limit {export.tolerance[n]:.1e})" for n in export.max_abs_diff
    )
    print(f"[{spec.name}] max abs diff ONNX Runtime vs torch: {diffs}", flush=True)
    tuning = tuning_for(spec, options)
    served = write_artifact(spec, options, export, tuning)
    write_model_files(spec, options, export, choice, tuning, served)
    write_pipeline(spec, options, tuning)
    print(f"[{spec.name}] wrote {options.repository / spec.name} ({options.target}, {choice.describe()})", flush=True)
    return {"model": spec.name, "weights": choice.source, "max_abs_diff": export.max_abs_diff}


def prepare_generation(spec, options: Options, exporter=None) -> dict:
    """A generation model: its checked graphs and the python-backend model that generates over them,
    for any target (the target picks ONNX Runtime's providers). ``exporter``: the module that exports
    and checks them (``ensure_export``, ``write_version`` and ``CHECKED``, what its checks held), a
    text2text model's three graphs (``generation_export``) by default."""
    from scripts.model_prep import generation_export, onnx_export, transformers_export

    exporter = exporter or generation_export
    choice = transformers_export.choose_weights(spec, options)
    cache = options.cache_dir / "onnx" / spec.name / choice.cache_key
    report = exporter.ensure_export(spec, choice, cache, options.reexport, step)
    diffs = ", ".join(
        f"{n} {report['max_abs_diff'][n]:.2e} (limit {report['tolerance'][n]:.1e})" for n in report["max_abs_diff"]
    )
    print(f"[{spec.name}] max abs diff ONNX Runtime vs torch: {diffs}; {exporter.CHECKED}", flush=True)
    tuning = tuning_for(spec, options)
    version = options.repository / spec.name / VERSION
    exporter.write_version(version, cache, link_or_copy, graphs=not options.config_only)
    export = onnx_export.ExportResult(cache, report["onnx_sha256"], report["max_abs_diff"], report["tolerance"], True)
    write_model_files(spec, options, export, choice, tuning)
    print(f"[{spec.name}] wrote {options.repository / spec.name} ({options.target}, {choice.describe()})", flush=True)
    return {"model": spec.name, "weights": choice.source, "max_abs_diff": report["max_abs_diff"]}


def prepare_onnx_file(spec, options: Options) -> dict:
    """A model whose ONNX file the user placed in its folder (``[export] onnx = "model.onnx"``):
    checked (onnx.checker, its tensors against model.toml, ONNX Runtime at batch 2), then written
    for the target like the others. There is no framework model to compare it with."""
    from scripts.model_prep import onnx_export, weights

    path = spec.file(str(spec.export[ONNX_KEY]))
    if not path.is_file():
        raise onnx_export.ExportError(f"[{spec.name}] [export] {ONNX_KEY}: {path} does not exist")
    missing = [name for name in _data_file_names(spec) if not spec.file(name).is_file()]
    if missing:
        raise onnx_export.ExportError(f"[{spec.name}] {spec.folder / missing[0]} (named in model.toml) does not exist")
    with step(spec.name, f"checking {path} (onnx.checker, tensors, ONNX Runtime at batch {onnx_export.CHECK_BATCH})"):
        export = onnx_export.check_file(path, spec, options.seed, cache_dir=options.cache_dir)
    choice = weights.WeightsChoice(weights.FILE, options.seed, path)
    tuning = tuning_for(spec, options)
    served = write_artifact(spec, options, export, tuning)
    write_model_files(spec, options, export, choice, tuning, served)
    write_pipeline(spec, options, tuning)
    print(f"[{spec.name}] wrote {options.repository / spec.name} ({options.target}, {choice.describe()})", flush=True)
    return {"model": spec.name, "weights": choice.source, "max_abs_diff": {}}


@dataclass(frozen=True)
class Steps:
    """What a family's export (``Family.export``) calls to write its model: the shared preparation of
    one checked graph (``prepare``), and a generation model's graphs and loop (``prepare_generation``)."""

    prepare: Callable[..., dict]
    prepare_generation: Callable[..., dict]


STEPS = Steps(prepare=prepare, prepare_generation=prepare_generation)
