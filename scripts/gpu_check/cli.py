"""``python -m scripts.gpu_check``: the image models' DALI steps on this machine's GPU, as Triton's
DALI backend runs them (the ``dali.py`` model preparation writes, serialised and deserialised on
device 0: ``scripts.gpu_check.serialized``), in images/s at batch ``--batch``, outputs left on the GPU.

For each model and each decoder (``--decoders``: ``exact``, libjpeg's chroma upsampling, the
router's pixels; ``fast``, nvJPEG's own), 1, 2 and 3 copies side by side (``--copies``): a pipeline
and a thread each, as Triton runs one pipeline per instance of the step and one batch at a time in
it, each with the CPU threads the sizing gives the step on this machine (``--threads`` to choose; the
config's ``num_threads``). The settings take turns:
``--rounds`` rounds, in each of them every setting runs ``--seconds`` (the order rotating), so that
drift hits all alike. Prints progress, then a table. Where DALI cannot run on a GPU (no NVIDIA GPU,
or no DALI) it prints one line saying why nothing was measured and exits 0.

    .venv/bin/python -m scripts.gpu_check                       # resnet and yolov5, build/samples/*.jpg
    .venv/bin/python -m scripts.gpu_check --models resnet --batch 32 --threads 8 --copies 1,2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.core.machine import detect
from app.core.pipeline import preprocess_model
from app.core.settings import MODEL_REPOSITORY, PROJECT_ROOT
from app.core.spec import ModelSpec, SpecError
from app.serve.sizing_plan import format_plan
from clients.families import load_spec
from clients.sized_configs import parts_from_specs, plan_models
from scripts.gpu_check import serialized
from scripts.model_prep import dali_pipeline
from scripts.terminal import positive, text_table

SAMPLES = PROJECT_ROOT / "build" / "samples"
PROG = "python -m scripts.gpu_check"


def _numbers(text: str) -> list[int]:
    try:
        values = [positive(int)(v) for v in text.split(",") if v.strip()]
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"positive integers, comma-separated, expected: {text!r} ({error})") from None
    if not values:
        raise argparse.ArgumentTypeError(f"positive integers, comma-separated, expected: {text!r}")
    return values


def _decoders(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or not set(values) <= set(serialized.DECODERS):
        raise argparse.ArgumentTypeError(f"decoders among {', '.join(serialized.DECODERS)} expected: {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--repository",
        type=Path,
        default=Path(os.environ.get(MODEL_REPOSITORY) or PROJECT_ROOT / "models"),
        help="where the models' model.toml are",
    )
    p.add_argument("--models", default="resnet,yolov5", help="comma-separated image models")
    p.add_argument("--images", type=Path, nargs="+", help="the photos (default: build/samples/*.jpg, `make samples`)")
    p.add_argument("--batch", type=positive(int), default=128, help="images a batch (the config's max_batch_size)")
    p.add_argument(
        "--threads",
        type=positive(int, zero=True),
        default=0,
        help="CPU threads of each copy (default: the sizing's num_threads for this machine)",
    )
    p.add_argument("--copies", type=_numbers, default="1,2,3", help="copies side by side, comma-separated")
    p.add_argument("--decoders", type=_decoders, default="exact,fast", help="[preprocess] decoder values")
    p.add_argument("--rounds", type=positive(int), default=2, help="interleaved rounds")
    p.add_argument("--seconds", type=positive(float), default=3.0, help="seconds per setting per round")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured batches through each pipeline first")
    return p.parse_args(argv)


@dataclasses.dataclass
class Setting:
    """One decoder and number of copies of a model's step, and what they did so far."""

    decoder: str
    copies: int
    images: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0


def side_by_side(pipelines: Sequence[Any], batch: tuple[list, list], seconds: float) -> tuple[int, float]:
    """Every pipeline run in a thread of its own on the same batch for ``seconds``: (images done,
    seconds taken, until the last batch's work on the GPU is done)."""
    size, stop, errors = len(batch[0]), threading.Event(), []
    done = [0] * len(pipelines)
    start = threading.Barrier(len(pipelines) + 1)

    def work(k: int, pipeline: Any) -> None:
        start.wait()
        try:
            outputs = None
            while not stop.is_set():
                outputs = serialized.run(pipeline, batch)
                done[k] += size
            if outputs is not None:
                outputs[-1].as_cpu()  # waits for the batch's GPU work (a small copy for a detector)
        except RuntimeError as error:
            errors.append(error)

    workers = [threading.Thread(target=work, args=(k, p), daemon=True) for k, p in enumerate(pipelines)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(done), time.perf_counter() - began


def check_model(spec: ModelSpec, photos: Sequence[bytes], args: argparse.Namespace, work: Path) -> list[Setting]:
    """Every setting of one model, interleaved; the pipelines are built once (the largest number
    of copies for each decoder) and given back before the next model."""
    images = [photos[i % len(photos)] for i in range(args.batch)]
    batch = serialized.encoded(images)
    pipelines: dict[str, list[Any]] = {}
    for decoder in args.decoders:
        folder = work / f"{spec.name}-{decoder}"
        first = serialized.serialized_pipeline(spec, folder, args.batch, args.threads, decoder)
        copies = [first] + [
            serialized.deserialize(folder / serialized.SERIALIZED_FILE, args.batch, args.threads)
            for _ in range(max(args.copies) - 1)
        ]
        for pipeline in copies:
            for _ in range(args.warmup):
                serialized.run(pipeline, batch)
        pipelines[decoder] = copies
        print(f"  {spec.name} decoder {decoder}: {len(copies)} pipelines built and warmed up", flush=True)
    settings = [Setting(decoder, copies) for decoder in args.decoders for copies in args.copies]
    for r in range(args.rounds):
        shift = r % len(settings)
        for setting in settings[shift:] + settings[:shift]:
            images_done, seconds = side_by_side(pipelines[setting.decoder][: setting.copies], batch, args.seconds)
            setting.images += images_done
            setting.seconds += seconds
            print(
                f"  {spec.name} round {r + 1} decoder {setting.decoder} copies {setting.copies}: "
                f"{setting.rate:,.0f} images/s so far",
                flush=True,
            )
    return settings


def format_table(results: Sequence[tuple[str, int, Sequence[Setting]]]) -> str:
    table = [("model", "decoder", "copies", "threads each", "images/s", "per copy", "x 1 copy")]
    for model, threads, settings in results:
        for s in settings:
            one = next((o for o in settings if o.decoder == s.decoder and o.copies == 1), None)
            ratio = f"{s.rate / one.rate:.2f}" if one is not None and one.rate else "-"
            table.append(
                (model, s.decoder, str(s.copies), str(threads), f"{s.rate:,.0f}", f"{s.rate / s.copies:,.0f}", ratio)
            )
    return text_table(table, right=range(2, len(table[0])))


def sized_threads(specs: Sequence[ModelSpec]) -> dict[str, int]:
    """Each model's DALI num_threads as serve sizes it on this machine (its plan printed)."""
    machine = detect()
    plan = plan_models(machine, parts_from_specs({s.name: s for s in specs}, "tensorrt", machine), os.environ)
    print(format_plan(plan), flush=True)
    return {spec.name: plan.part(preprocess_model(spec.name)).threads for spec in specs}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = serialized.gpu_missing()
    if missing is not None:
        print(f"gpu_check: nothing measured: {missing}", flush=True)
        return 0
    paths = args.images or sorted(SAMPLES.glob("*.jpg"))
    if not paths or not all(p.is_file() for p in paths):
        print(f"{PROG}: no photos ({SAMPLES}/*.jpg): run `make samples`, or pass --images", flush=True)
        return 2
    photos = [p.read_bytes() for p in paths]
    try:
        specs = [load_spec(args.repository / m) for m in args.models.split(",") if m]
        for spec in specs:
            dali_pipeline.preprocess_params(spec)  # an image model whose settings the step takes
    except SpecError as error:
        print(f"{PROG}: {error}", flush=True)
        return 2
    threads = {spec.name: args.threads for spec in specs} if args.threads else sized_threads(specs)
    print(
        f"DALI on the GPU, as Triton's DALI backend runs it: {', '.join(s.name for s in specs)}; "
        f"{len(photos)} photos ({sum(map(len, photos)) / len(photos) / 1024:.0f} KB on average) in batches "
        f"of {args.batch}; {', '.join(f'{n} {t}' for n, t in threads.items())} threads a copy; copies {', '.join(map(str, args.copies))}; "
        f"decoders {', '.join(args.decoders)}; {args.rounds} rounds of {args.seconds:g} s a setting",
        flush=True,
    )
    began = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for spec in specs:
            own = argparse.Namespace(**{**vars(args), "threads": threads[spec.name]})
            results.append((spec.name, threads[spec.name], check_model(spec, photos, own, Path(work))))
    print(f"\n{format_table(results)}\n({time.monotonic() - began:.0f} s)")
    return 0
