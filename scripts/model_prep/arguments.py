"""``python -m scripts.model_prep``'s command line: its arguments, read into one frozen ``Options``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import PROJECT_ROOT

DEFAULT_SOURCE = PROJECT_ROOT / "models"
BUILD_DIR = PROJECT_ROOT / "build"


@dataclass(frozen=True)
class Options:
    target: str
    models: list[str]
    source: Path
    repository: Path
    weights: str
    weights_files: dict[str, Path]
    seed: int
    max_batch_size: dict[str, int]
    max_queue_delay_us: dict[str, int]
    instance_count: dict[str, int]
    ort_threads: int
    precision: str
    config_only: bool
    reexport: bool
    cache_dir: Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from scripts.model_prep.triton_config import TARGETS

    parser = argparse.ArgumentParser(
        prog="python -m scripts.model_prep",
        description="Export the models to ONNX and write a Triton model repository for one target.",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="python",
        help="python: ONNX Runtime in Triton's python backend (default); onnxruntime: "
        "Triton's onnxruntime backend; tensorrt: a TensorRT engine (needs a GPU)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help="models to prepare (default: every folder of --source with a model.toml)",
    )
    parser.add_argument(
        "--source", type=Path, default=DEFAULT_SOURCE, help="folder of the model descriptions (default: %(default)s)"
    )
    parser.add_argument("--repository", type=Path, help="output model repository (default: --source, in place)")
    parser.add_argument(
        "--weights",
        choices=("pretrained", "random", "small"),
        default="pretrained",
        help="pretrained (falls back to random, loudly, when offline), seeded random, or small: "
        "a small network of the model's family with seeded random weights (same inputs, "
        "outputs and processing; fewer layers and channels), for tests",
    )
    parser.add_argument(
        "--weights-file",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="weights of one model: a torch state_dict (resnet, yolov5) or a "
        "save_pretrained() directory (bert); repeatable",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of random weights (default: 0)")
    parser.add_argument(
        "--max-batch-size",
        action="append",
        default=[],
        metavar="[NAME=]N",
        help="Triton max_batch_size, for all models or one; repeatable",
    )
    parser.add_argument(
        "--max-queue-delay-us",
        action="append",
        default=[],
        metavar="[NAME=]N",
        help="dynamic batching max_queue_delay_microseconds; repeatable",
    )
    parser.add_argument(
        "--instance-count", action="append", default=[], metavar="[NAME=]N", help="instance_group count; repeatable"
    )
    parser.add_argument(
        "--ort-threads",
        type=int,
        default=0,
        help="python target: ONNX Runtime intra-op threads per instance (default: the model.toml's "
        "[instances] threads, else ONNX Runtime's own)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp16", "fp32"),
        default="fp16",
        help="tensorrt target: engine precision (default: fp16)",
    )
    parser.add_argument(
        "--config-only",
        action="store_true",
        help="write config.pbtxt and the other small files, not the model artifact",
    )
    parser.add_argument("--reexport", action="store_true", help="ignore the ONNX cache under build/onnx")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=BUILD_DIR,
        help="ONNX exports, downloads and the TensorRT timing cache (default: %(default)s)",
    )
    return parser.parse_args(argv)


def per_model(values: list[str], option: str) -> dict[str, int]:
    """``N`` or ``NAME=N`` entries -> {NAME or "*": N}; the last entry for a key wins."""
    result = {}
    for value in values:
        name, _, number = value.rpartition("=")
        try:
            result[name or "*"] = int(number)
        except ValueError:
            raise SystemExit(f"prepare_models: error: {option} {value!r}: expected N or NAME=N") from None
        if result[name or "*"] < (0 if option == "--max-queue-delay-us" else 1):
            raise SystemExit(f"prepare_models: error: {option} {value!r}: out of range")
    return result


def weights_files(values: list[str]) -> dict[str, Path]:
    result = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"prepare_models: error: --weights-file {value!r}: expected NAME=PATH")
        if not Path(path).exists():
            raise SystemExit(f"prepare_models: error: --weights-file {value!r}: {path} does not exist")
        result[name] = Path(path)
    return result


def make_options(args: argparse.Namespace) -> Options:
    from app.core.spec import SPEC_FILE

    source = args.source.resolve()
    # the folders with a model.toml (each is read, and its mistakes named, when it is prepared)
    available = sorted(p.name for p in source.iterdir() if (p / SPEC_FILE).is_file()) if source.is_dir() else []
    names = [n for item in args.models or available for n in item.split(",") if n]
    unknown = sorted(set(names) - set(available))
    if unknown or not names:
        raise SystemExit(
            f"prepare_models: error: no model.toml for {unknown or 'any model'} "
            f"in {source} (available: {', '.join(available) or 'none'})"
        )
    files = weights_files(args.weights_file)
    unknown_files = sorted(set(files) - set(available))
    if unknown_files:
        raise SystemExit(f"prepare_models: error: --weights-file names unknown models {unknown_files}")
    return Options(
        target=args.target,
        models=names,
        source=source,
        repository=(args.repository or source).resolve(),
        weights=args.weights,
        weights_files=files,
        seed=args.seed,
        max_batch_size=per_model(args.max_batch_size, "--max-batch-size"),
        max_queue_delay_us=per_model(args.max_queue_delay_us, "--max-queue-delay-us"),
        instance_count=per_model(args.instance_count, "--instance-count"),
        ort_threads=args.ort_threads,
        precision=args.precision,
        config_only=args.config_only,
        reexport=args.reexport,
        cache_dir=args.cache_dir.resolve(),
    )
