"""``python -m scripts.bench.preprocessing``: an image model's preprocessing on the CPU, two ways,
side by side in one run on the same photos and the same number of threads:

- ``router``: the model's own client (``clients``, PIL and OpenCV), as the router runs it on the
  router pipeline: one image a call (one request), ``--threads`` calls at a time in one process
  (one gunicorn worker's threads; PIL and OpenCV release the GIL while they decode and resize).
  A classifier served on its fast path (``fast_path = true``: JPEG draft-mode decode) is measured
  on it and on the exact path (``router-exact``: torchvision's pixels, what DALI reproduces);
- ``dali-cpu``: the Triton preprocessing step's DALI pipeline (scripts/model_prep/dali_pipeline.py)
  on DALI's CPU operators, ``--threads`` DALI threads, batches of ``--batch`` images.

The sides take turns: ``--rounds`` rounds, in each of them every side runs ``--seconds`` (the order
rotating), so that machine drift hits all sides alike. Prints images/s of each side, the ratio of
DALI's to the router's, and the mean difference of their tensors in levels of 255 (per photo: the
mean over the photo's values; the table gives the mean and the largest of those per-photo means).
On a GPU the step decodes with nvJPEG on ``mixed`` instead; that is not measured here.

    .venv/bin/python -m scripts.bench.preprocessing                 # resnet and yolov5, build/samples/*.jpg
    .venv/bin/python -m scripts.bench.preprocessing --threads 1 --batch 1 --models resnet
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.core.pipeline import ROUTER
from app.core.settings import MODEL_REPOSITORY, PROJECT_ROOT, Settings
from app.core.spec import ModelSpec
from clients.families import family_of, load_spec
from scripts.bench.load import run_load
from scripts.terminal import text_table

SAMPLES = PROJECT_ROOT / "build" / "samples"
ROUTER_SIDE, EXACT_SIDE, DALI_SIDE = "router", "router-exact", "dali-cpu"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.preprocessing",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--repository",
        type=Path,
        default=Path(os.environ.get(MODEL_REPOSITORY) or PROJECT_ROOT / "models"),
        help="where the models' model.toml are",
    )
    p.add_argument("--models", default="resnet,yolov5", help="comma-separated image models")
    p.add_argument(
        "--images",
        type=Path,
        nargs="+",
        default=None,
        help="the photos (default: build/samples/*.jpg, from `make samples`)",
    )
    p.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="router calls at a time, and DALI's threads"
    )
    p.add_argument("--batch", type=int, default=0, help="DALI's batch size (0: the model's max_batch_size)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per side per round")
    p.add_argument("--warmup-seconds", type=float, default=0.5, help="unmeasured run per side first")
    return p.parse_args(argv)


def router_client(spec: ModelSpec, fast_path: bool | None = None):
    """The model's client as the router builds it (on the router pipeline); ``fast_path`` overrides
    a classifier's setting."""
    from clients.families import offline_client

    if fast_path is not None:
        spec = dataclasses.replace(spec, preprocess={**spec.preprocess, "fast_path": fast_path})
    return offline_client(dataclasses.replace(spec, pipeline=ROUTER), Settings())


def levels(client, tensor: np.ndarray) -> np.ndarray:
    """A network input back to levels of 255, up to each channel's offset (enough for differences):
    the client's normalisation table is affine per channel, in the model's channel order."""
    lut = client.lut
    per = np.ones(3) if lut is None else (lut[:, 255].astype(np.float64) - lut[:, 0]) / 255
    shape = (3, 1, 1) if client.layout == "NCHW" else (1, 1, 3)
    return tensor.astype(np.float64) / per.reshape(shape)


@dataclasses.dataclass
class Side:
    name: str
    images_per_call: int
    call: Callable[[], Any]
    concurrency: int
    images: float = 0.0
    seconds: float = 0.0
    errors: int = 0
    first_error: str = ""

    def measure(self, seconds: float) -> None:
        load = run_load(self.call, self.concurrency, seconds)
        self.images += load.work * self.images_per_call
        self.seconds += load.window_s
        self.errors += load.errors
        self.first_error = self.first_error or load.first_error

    @property
    def rate(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0


def bench_model(spec: ModelSpec, photos: Sequence[bytes], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every side of one model, interleaved; one row a side: images/s, ratio, level differences."""
    from scripts.model_prep import dali_pipeline

    batch = args.batch or spec.max_batch_size
    clients = {ROUTER_SIDE: router_client(spec)}
    if getattr(clients[ROUTER_SIDE], "fast_path", False):
        clients[EXACT_SIDE] = router_client(spec, fast_path=False)
    pipeline = dali_pipeline.build_cpu_pipeline(spec, batch_size=batch, num_threads=args.threads)
    counter = itertools.count()

    def router_call(client) -> Callable[[], Any]:
        return lambda: client.preprocess(photos[next(counter) % len(photos)], "img", {})

    batches = [[photos[(k * batch + i) % len(photos)] for i in range(batch)] for k in range(len(photos))]
    batch_counter = itertools.count()
    sides = [Side(name, 1, router_call(client), args.threads) for name, client in clients.items()]

    def dali_call() -> Any:
        return dali_pipeline.run_cpu(pipeline, batches[next(batch_counter) % len(batches)])

    sides.append(Side(DALI_SIDE, batch, dali_call, concurrency=1))  # DALI's own threads work on the batch

    # the same photos through both: the tensors' difference in levels, per photo
    dali_out = [
        out
        for k in range(0, len(photos), batch)  # a batch may hold fewer than its size
        for out in dali_pipeline.run_cpu(pipeline, photos[k : k + batch])[0]
    ]
    name = spec.inputs[0].name
    diffs: dict[str, list[float]] = {}
    for side, client in clients.items():
        diffs[side] = [
            float(np.abs(levels(client, client.preprocess(data, "img", {})[0][name]) - levels(client, ours)).mean())
            for data, ours in zip(photos, dali_out)
        ]

    for side in sides:
        if args.warmup_seconds > 0:
            side.measure(args.warmup_seconds)
            side.images = side.seconds = 0.0
    for r in range(args.rounds):
        shift = r % len(sides)
        for side in sides[shift:] + sides[:shift]:
            side.measure(args.seconds)
            print(f"  {spec.name} round {r + 1} {side.name}: {side.rate:.1f} images/s so far", flush=True)

    rows = []
    for side in sides:
        row: dict[str, Any] = {
            "model": spec.name,
            "side": side.name,
            "images_per_s": side.rate,
            "errors": side.errors,
            "first_error": side.first_error,
        }
        if side.name == DALI_SIDE:
            row["vs_router"] = {s.name: side.rate / s.rate if s.rate else float("nan") for s in sides[:-1]}
        else:
            row["diff_levels"] = (float(np.mean(diffs[side.name])), max(diffs[side.name]))
        rows.append(row)
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    table = [("model", "side", "images/s", "dali-cpu / this", "mean |dali - this| levels (max photo)")]
    for row in rows:
        dali = next(r for r in rows if r["model"] == row["model"] and r["side"] == DALI_SIDE)
        ratio = dali["vs_router"].get(row["side"]) if row["side"] != DALI_SIDE else None
        diff = row.get("diff_levels")
        table.append(
            (
                row["model"],
                row["side"],
                f"{row['images_per_s']:.1f}",
                f"{ratio:.2f}" if ratio is not None else "-",
                f"{diff[0]:.3f} ({diff[1]:.3f})" if diff else "-",
            )
        )
    return text_table(table, right=(2, 3))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    paths = args.images or sorted(SAMPLES.glob("*.jpg"))
    if not paths or not all(p.is_file() for p in paths):
        print(
            f"no photos ({', '.join(map(str, paths)) or SAMPLES / '*.jpg'}): run `make samples`, or pass --images",
            file=sys.stderr,
        )
        return 2
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        print("nvidia.dali is not installed: pip install nvidia-dali-cuda120 (requirements-dev.txt)", file=sys.stderr)
        return 2
    photos = [p.read_bytes() for p in paths]
    specs = [load_spec(args.repository / m) for m in args.models.split(",") if m]
    for spec in specs:
        if not family_of(spec).dali:  # the image families: their preprocessing runs in DALI too
            print(f"{spec.name}: family {spec.family} has no image preprocessing", file=sys.stderr)
            return 2
    print(
        f"preprocessing on the CPU: {len(photos)} photos ({', '.join(p.name for p in paths)}; "
        f"{sum(map(len, photos)) / len(photos) / 1024:.0f} KB on average), {args.threads} threads, "
        f"{args.rounds} rounds of {args.seconds:g} s per side, DALI batch "
        f"{args.batch or ', '.join(f'{s.name} {s.max_batch_size}' for s in specs)}",
        flush=True,
    )
    began = time.monotonic()
    rows = [row for spec in specs for row in bench_model(spec, photos, args)]
    print(f"\n{format_rows(rows)}")
    for row in rows:
        if row["side"] == DALI_SIDE:
            ratios = ", ".join(f"{rate:.2f}x {side}" for side, rate in row["vs_router"].items())
            print(f"{row['model']}: DALI CPU {row['images_per_s']:.1f} images/s = {ratios}")
        if row["errors"]:
            print(f"{row['model']} {row['side']}: {row['errors']} errors, first: {row['first_error']}")
    print(f"({time.monotonic() - began:.0f} s)")
    return 1 if any(row["errors"] for row in rows) else 0
