"""Package a Triton model repository as the model.tar.gz SageMaker's ModelDataUrl points at.

SageMaker extracts the tarball into /opt/ml/model, where `serve` finds the repository, so the
model folders sit at the archive's top level. Before anything is written the repository is
checked: every model folder has its config.pbtxt and model.toml (an image pipeline's steps take
their model's), and a numbered version folder holding the artifact its config names (model.plan,
model.onnx, model.py or dali.py; an ensemble needs none, only the folder). The archive holds
regular files and folders only: symlinks (which fail SageMaker's extraction) and hard links (which
`make models` uses) are stored as the files they point at; caches are left out; every file is
readable by the image's non-root user.

    python -m scripts.sagemaker package-models --repository models --output build/model.tar.gz
    python -m scripts.sagemaker package-models --upload s3://my-bucket/multi-model/model.tar.gz
    python -m scripts.sagemaker package-models --check-only

--per-model writes one <NAME>.tar.gz per served model instead, for a multi-model endpoint or an
endpoint of inference components (python -m scripts.sagemaker deploy --multi-model /
--inference-components): a model with a model.toml together with the steps of its Triton pipeline
that the repository holds
(<NAME>_preprocess, <NAME>_postprocess, the ensemble <NAME>_pipeline), a chain (grounded_segmentation)
with the folders of the models it names too (each of them also has an archive of its own), and every
other model folder (a plain Triton model, without model.toml) on its own. The folders sit at each archive's top level:
SageMaker extracts it to /opt/ml/models/<hash>/model/ (a multi-model endpoint) or /opt/ml/model (an
inference component), and the container serves the folders it finds there.

    python -m scripts.sagemaker package-models --per-model --output build/per-model/
    python -m scripts.sagemaker package-models --per-model --upload s3://my-bucket/models/
        # -> s3://my-bucket/models/<NAME>.tar.gz
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.settings import PROJECT_ROOT
from scripts.model_prep import triton_config
from scripts.sagemaker.resources import ARCHIVE_SUFFIX, folder, split_s3

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

SKIPPED_NAMES = {"__pycache__", ".ipynb_checkpoints"}
SKIPPED_SUFFIXES = {".pyc", ".pyo"}
# Triton's default artifact per platform / backend (config.pbtxt's default_model_filename overrides).
ARTIFACTS = {
    "tensorrt_plan": "model.plan",
    "onnxruntime_onnx": "model.onnx",
    "python": "model.py",
    "tensorrt": "model.plan",
    "onnxruntime": "model.onnx",
    # the DALI backend serialises the pipeline file when it loads the model (autoserialization)
    "dali": "dali.py",
}


DEFAULT_TARBALL = PROJECT_ROOT / "build" / "model.tar.gz"
DEFAULT_PER_MODEL_DIR = PROJECT_ROOT / "build" / "per-model"
SPEC = "model.toml"


class InvalidRepository(ValueError):
    pass


def expected_artifact(config: ModelConfig) -> str | None:
    """The artifact Triton loads for a model's configuration (its config.pbtxt, as Triton's ModelConfig)."""
    return config.default_model_filename or ARTIFACTS.get(config.platform or config.backend)


def _skipped(path: Path) -> bool:
    return any(part in SKIPPED_NAMES for part in path.parts) or path.suffix in SKIPPED_SUFFIXES


def text_extras(model: Path) -> set[Path]:
    """The files of a text model's Hugging Face folder the router does not read (its weights, when the
    repository is the models' own folder): they stay out of the archive (app.core.text_spec)."""
    import tomllib

    from app.core.text_spec import ROUTER_FILES, SOURCE_KEY, is_text_spec, text_folder

    try:
        raw = tomllib.loads((model / SPEC).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    source = raw.get("export", {}).get(SOURCE_KEY)
    if not is_text_spec(raw) or not isinstance(source, str):
        return set()
    folder = text_folder(model, source)
    kept = {folder / name for name in ROUTER_FILES} | {p for p in folder.glob("*/config.json")}
    return {p for p in folder.rglob("*") if p.is_file() and p not in kept}


def missing_parts(model: Path) -> list[str]:
    """A chain's models (``app.core.named_models``) that are not model folders beside it."""
    from app.core.named_models import named_models
    from clients.families import FAMILIES

    return [
        f"{model.name}: {key} = {part!r} is not a model folder of the repository (no {part}/{SPEC})"
        for key, part in named_models(model, FAMILIES).items()
        if not (model.parent / part / SPEC).is_file()
    ]


def model_folders(repository: Path) -> list[Path]:
    return sorted(
        p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in SKIPPED_NAMES
    )


def step_names(name: str) -> tuple[str, ...]:
    """The Triton pipeline's model names of the model ``name`` (app.core.pipeline): its steps and ensemble."""
    from app.core.pipeline import ensemble_model, postprocess_model, preprocess_model

    return tuple(step(name) for step in (preprocess_model, postprocess_model, ensemble_model))


def pipeline_steps(models: Sequence[Path]) -> dict[str, str]:
    """The folders of the Triton pipelines (app.core.pipeline) of the models that have a model.toml,
    each with its model's name: their settings are the model's own, so they carry no model.toml."""
    return {step: model.name for model in models if (model / SPEC).is_file() for step in step_names(model.name)}


def validate(repository: Path, plain: bool = False) -> list[Path]:
    """The files (and an ensemble's empty version folder) to package, relative to ``repository``;
    InvalidRepository lists every problem. With ``plain``, a folder without model.toml that is no
    pipeline step is a plain Triton model (one KServe v2 bodies reach), not a problem."""
    if not repository.is_dir():
        raise InvalidRepository(f"{repository} is not a folder")
    problems: list[str] = []
    files: list[Path] = []
    models = model_folders(repository)
    steps = pipeline_steps(models)
    if not models:
        problems.append(f"{repository} holds no model folder")
    for model in models:
        name = model.name
        config = model / "config.pbtxt"
        if not config.is_file():
            problems.append(f"{name}: no config.pbtxt (run python -m scripts.model_prep for the target)")
        if not (model / SPEC).is_file() and name not in steps and not plain:
            problems.append(f"{name}: no model.toml (the router reads the model's settings from it)")
        versions = sorted(p for p in model.iterdir() if p.is_dir() and p.name.isdigit())
        if not versions:
            problems.append(f"{name}: no numbered version folder (e.g. {name}/1/)")
        artifact, ensemble = None, False
        if config.is_file():
            try:
                parsed = triton_config.read_config(config)
                artifact, ensemble = expected_artifact(parsed), parsed.platform == "ensemble"
            except triton_config.ParseError as error:
                problems.append(f"{name}: config.pbtxt is not a Triton model configuration: {error}")
        for version in versions:
            if ensemble:  # an ensemble has no artifact; Triton needs its folder, even empty
                files.append(version.relative_to(repository))
            elif artifact is not None:
                path = version / artifact
                if not path.is_file():
                    problems.append(f"{name}/{version.name}: no {artifact}, the artifact config.pbtxt names")
                elif path.stat().st_size == 0:
                    problems.append(f"{name}/{version.name}/{artifact} is empty")
            elif not any(p.is_file() and not _skipped(p) for p in version.rglob("*")):
                problems.append(f"{name}/{version.name}: empty version folder")
        problems += missing_parts(model)
        extras = text_extras(model)
        for path in sorted(model.rglob("*")):
            relative = path.relative_to(repository)
            if _skipped(relative) or path in extras:
                continue
            if path.is_symlink() and not path.exists():
                problems.append(f"{relative} is a broken symlink")
            elif path.is_file():
                files.append(relative)
    if problems:
        raise InvalidRepository("invalid model repository:\n  " + "\n  ".join(problems))
    return files


def per_model(repository: Path, files: Sequence[Path]) -> dict[str, list[Path]]:
    """Each served model's files, by its name: a model with a model.toml with its pipeline's folders
    (those in ``files``), a chain with the folders of the models it names (``app.core.named_models``),
    every other folder on its own."""
    from app.core.named_models import named_models
    from clients.families import FAMILIES

    owner = pipeline_steps(model_folders(repository))
    groups: dict[str, list[Path]] = {}
    for relative in files:
        groups.setdefault(owner.get(relative.parts[0], relative.parts[0]), []).append(relative)
    for name in list(groups):
        for part in named_models(repository / name, FAMILIES).values():
            groups[name] += [f for f in files if f.parts[0] == part]  # its folder, not its pipeline's
    return dict(sorted(groups.items()))


def _info(name: str, *, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.size = size
    info.mtime = int(time.time())
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write_tarball(repository: Path, files: Sequence[Path], output: Path, log=print) -> None:
    """Regular files and folders only: each file's content is read through any link."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    total = sum((repository / f).stat().st_size for f in files if (repository / f).is_file())
    done = 0
    folders: set[str] = set()
    with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
        for relative in files:
            for parent in reversed(relative.parents[:-1]):
                if parent.as_posix() not in folders:
                    folders.add(parent.as_posix())
                    tar.addfile(_info(parent.as_posix(), directory=True))
            source = repository / relative
            if source.is_dir():
                if relative.as_posix() not in folders:
                    folders.add(relative.as_posix())
                    tar.addfile(_info(relative.as_posix(), directory=True))
                continue
            size = source.stat().st_size
            with source.open("rb") as handle:
                tar.addfile(_info(relative.as_posix(), size=size), handle)
            done += size
            log(
                f"  {relative.as_posix()} ({size / 1e6:.1f} MB; {100 * done / max(total, 1):.0f}% of {total / 1e6:.0f} MB)"
            )
    partial.replace(output)


def check_tarball(output: Path) -> list[str]:
    """Member names; raises InvalidRepository on anything but plain files and folders."""
    with tarfile.open(output, "r:gz") as tar:
        members = tar.getmembers()
    for member in members:
        if not (member.isfile() or member.isdir()):
            raise InvalidRepository(f"{output}: {member.name} is not a plain file or folder")
        if member.name.startswith("/") or ".." in Path(member.name).parts:
            raise InvalidRepository(f"{output}: {member.name} points outside the archive")
    return [m.name for m in members]


def write_per_model(repository: Path, groups: dict[str, list[Path]], output_dir: Path, log=print) -> list[Path]:
    """One checked ``<name>.tar.gz`` per model in ``output_dir``, each model's folders at its top level."""
    archives = []
    for number, (name, files) in enumerate(groups.items(), 1):
        archive = output_dir / f"{name}{ARCHIVE_SUFFIX}"
        log(f"[{number}/{len(groups)}] {name}: {', '.join(sorted({f.parts[0] for f in files}))} -> {archive}")
        write_tarball(repository, files, archive, log=log)
        check_tarball(archive)
        log(f"  wrote {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
        archives.append(archive)
    return archives


def parse_s3_url(url: str, filename: str) -> tuple[str, str]:
    bucket, key = split_s3(url, "s3://bucket/key")
    if not key or key.endswith("/"):
        key += filename
    return bucket, key


def upload(output: Path, url: str, region: str | None, endpoint_url: str | None, log=print) -> str:
    import boto3

    bucket, key = parse_s3_url(url, output.name)
    s3 = boto3.client("s3", region_name=region, endpoint_url=endpoint_url)
    total = output.stat().st_size
    sent = [0, -10]

    def progress(chunk: int) -> None:
        sent[0] += chunk
        percent = int(100 * sent[0] / max(total, 1))
        if percent >= sent[1] + 10:
            sent[1] = percent
            log(f"  uploaded {percent}% of {total / 1e6:.0f} MB")

    s3.upload_file(str(output), bucket, key, Callback=progress)
    return f"s3://{bucket}/{key}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.sagemaker package-models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repository",
        type=Path,
        default=PROJECT_ROOT / "models",
        help="the Triton model repository (default: models/)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="the tarball to write (default: build/model.tar.gz); with --per-model, the folder "
        "for the <NAME>.tar.gz archives (default: build/per-model/)",
    )
    parser.add_argument(
        "--upload",
        metavar="S3_URL",
        help="upload to s3://bucket/key (a key ending in / gets the file "
        "name); with --per-model, the prefix the archives go under",
    )
    parser.add_argument(
        "--per-model",
        action="store_true",
        help="one <NAME>.tar.gz per served model (with its Triton pipeline's folders; a plain Triton "
        "model folder on its own), for python -m scripts.sagemaker deploy --multi-model / "
        "--inference-components",
    )
    parser.add_argument("--check-only", action="store_true", help="validate the repository, write nothing")
    parser.add_argument("--region", help="AWS region for the upload")
    parser.add_argument("--endpoint-url", help="S3 endpoint (tests, S3-compatible stores)")
    args = parser.parse_args(argv)
    args.output = args.output or (DEFAULT_PER_MODEL_DIR if args.per_model else DEFAULT_TARBALL)
    return args


def package(args: argparse.Namespace, files: Sequence[Path]) -> None:
    """The whole repository as one model.tar.gz, checked, then uploaded when asked."""
    print(f"writing {args.output}")
    write_tarball(args.repository, files, args.output)
    check_tarball(args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size / 1e6:.1f} MB)")
    if args.upload:
        print(f"uploading to {args.upload}")
        url = upload(args.output, args.upload, args.region, args.endpoint_url)
        print(f"ModelDataUrl: {url}")


def package_per_model(args: argparse.Namespace, files: Sequence[Path]) -> None:
    """One archive per served model in the output folder (progress on stderr), uploaded when asked."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    groups = per_model(args.repository, files)
    print(f"writing {len(groups)} archives ({', '.join(groups)}) in {args.output}")
    archives = write_per_model(args.repository, groups, args.output, log=progress)
    if not args.upload:
        print(f"wrote {len(archives)} archives in {args.output}: upload them under one S3 prefix")
        return
    prefix = folder(args.upload)
    for archive in archives:
        progress(f"uploading {archive.name} to {prefix}")
        upload(archive, prefix, args.region, args.endpoint_url, log=progress)
    print(
        f"{len(archives)} archives under {prefix}: python -m scripts.sagemaker deploy --multi-model {prefix} "
        f"(or --inference-components {prefix} --component NAME ...)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        files = validate(args.repository, plain=args.per_model)
        models = sorted({f.parts[0] for f in files})
        print(f"{args.repository}: {len(models)} models ({', '.join(models)}), {len(files)} files: valid")
        if not args.check_only:
            (package_per_model if args.per_model else package)(args, files)
    except InvalidRepository as e:
        print(f"package_models: {e}", file=sys.stderr)
        return 1
    return 0
