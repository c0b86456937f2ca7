"""Build a Triton model repository for one target from the models' ``model.toml`` descriptions:
every description read and checked first, then each model prepared (``scripts.model_prep.steps``).

    python -m scripts.model_prep --target python --weights random
    python -m scripts.model_prep --target tensorrt --models resnet --max-batch-size 16
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from scripts.model_prep.arguments import DEFAULT_SOURCE, Options, make_options, parse_args  # noqa: F401 (the CLI's API)
from scripts.model_prep.steps import ONNX_KEY, STEPS, prepare, prepare_onnx_file


def checked_spec(folder: Path):
    """A model's spec, its family one of the families."""
    from app.core.spec import SPEC_FILE, SpecError
    from clients.families import FAMILIES, load_spec

    spec = load_spec(folder)
    if spec.family not in FAMILIES:
        raise SpecError(
            f"{spec.folder / SPEC_FILE}: family {spec.family!r} is not one of {', '.join(sorted(FAMILIES))}"
        )
    return spec


def check_first(options: Options) -> None:
    """Every model's model.toml read and checked before anything is prepared or any framework imported:
    a mistake in the last model is said at once, not after the others' exports. A model naming a
    hub id not fetched yet is read after its fetch (its folder completes its spec)."""
    from app.core.text_spec import unfetched_hub_id

    for name in options.models:
        if unfetched_hub_id(options.source / name) is None:
            checked_spec(options.source / name)


def run(options: Options) -> int:
    from clients.families import FAMILIES
    from scripts.model_prep import tensorrt_engine, transformers_export
    from scripts.model_prep.recipes import recipes

    if options.target == "tensorrt" and not options.config_only:
        missing = tensorrt_engine.missing_requirements()
        if missing:
            print(missing, file=sys.stderr, flush=True)
            return 1
    table = recipes()
    started = time.perf_counter()
    for name in options.models:
        transformers_export.fetch_hub(options.source / name)
        spec = checked_spec(options.source / name)
        family = FAMILIES[spec.family]
        if spec.text is not None or family.chains:  # a folder of the family's, or a chain: its own export
            family.exporter().prepare(spec, options, STEPS)
            continue
        builder, onnx_file = spec.export.get("builder"), spec.export.get(ONNX_KEY)
        if (builder is None) == (onnx_file is None):
            print(
                f"prepare_models: error: {name}: [export] needs either builder (one of "
                f"{', '.join(sorted(table))}) or {ONNX_KEY} (an ONNX file in the model's folder)",
                file=sys.stderr,
            )
            return 1
        if onnx_file is not None:
            prepare_onnx_file(spec, options)
            continue
        if builder not in table:
            print(
                f"prepare_models: error: {name}: unknown [export] builder {builder!r} "
                f"(known: {', '.join(sorted(table))})",
                file=sys.stderr,
            )
            return 1
        prepare(spec, table[builder], options)
    print(
        f"prepared {len(options.models)} model(s) for {options.target} in {options.repository} "
        f"in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    from app.core.spec import SpecError

    options = make_options(parse_args(argv))
    try:
        check_first(options)
    except SpecError as error:
        print(f"prepare_models: error: {error}", file=sys.stderr, flush=True)
        return 1
    from scripts.model_prep.detector_graph import GraphError
    from scripts.model_prep.onnx_export import ExportError
    from scripts.model_prep.recipes import RecipeError
    from scripts.model_prep.tensorrt_engine import EngineError

    try:
        return run(options)
    except (SpecError, ExportError, RecipeError, EngineError, GraphError) as error:
        print(f"prepare_models: error: {error}", file=sys.stderr, flush=True)
        return 1
