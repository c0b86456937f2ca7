"""``python -m scripts.bench.opencv_threads``: the router's OpenCV work on one thread against OpenCV's own
pool, side by side in one run.

``clients/images.py`` gives OpenCV one thread (``cv2.setNumThreads(1)``): the sizing plan counts each
router worker thread and each python preprocessing step as one CPU, and OpenCV's default pool (a
thread per core) spreads each call over every core. This measures what that choice does to the
letterbox a detector's request gets (``clients.images.letterbox``: resize and border, OpenCV's
calls) with 1, half the cores' and as many callers at a time as cores (a router's threads, each
letterboxing its own request), on photos of two sizes: images/s and CPU per image of each side, and
the ratio one thread / pool. The sides take turns within each round, the order swapped every round.
It needs numpy and OpenCV only (no model, no stack), so it runs on any machine of the project's.

    .venv/bin/python -m scripts.bench.opencv_threads                     # 3 rounds of 1.5 s a step
    .venv/bin/python -m scripts.bench.opencv_threads --callers 1,16 --seconds 3
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence

import cv2
import numpy as np

from clients import images

POOL = -1  # cv2.setNumThreads: OpenCV's default, a thread per core
SIZES = {"768x576": (576, 768), "1920x1080": (1080, 1920)}  # a sample photo's size, and a full-HD frame
INPUT_SIZE = 640  # yolov5's


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    cores = os.cpu_count() or 1
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.opencv_threads",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    default_callers = ",".join(str(n) for n in sorted({1, max(1, cores // 2), cores}))
    p.add_argument("--callers", default=default_callers, help="comma-separated callers at a time")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--seconds", type=float, default=1.5, help="seconds per step")
    args = p.parse_args(argv)
    try:
        args.callers = [int(n) for n in args.callers.split(",") if n]
    except ValueError:
        p.error(f"--callers must be comma-separated counts, not {args.callers!r}")
    if not args.callers or min(args.callers) < 1 or args.rounds < 1 or args.seconds <= 0:
        p.error("--callers, --rounds and --seconds must be positive")
    return args


def step(pixels: np.ndarray, callers: int, seconds: float) -> tuple[int, float, float]:
    """``callers`` threads letterboxing for ``seconds``: images done, wall seconds, this process's CPU
    seconds (OpenCV's pool threads included)."""
    done = [0] * callers
    deadline = time.perf_counter() + seconds

    def work(i: int) -> None:
        n = 0
        while True:  # one image at least: a thread started after the deadline (a loaded machine) still counts
            images.letterbox(pixels, INPUT_SIZE)
            n += 1
            if time.perf_counter() >= deadline:
                break
        done[i] = n

    threads = [threading.Thread(target=work, args=(i,)) for i in range(callers)]
    cpu, wall = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done), time.perf_counter() - wall, time.process_time() - cpu


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = cv2.getNumThreads()
    cv2.setNumThreads(POOL)
    pool = cv2.getNumThreads()
    print(
        f"{os.cpu_count()} cores, OpenCV {cv2.__version__} (its pool: {pool} threads), callers "
        f"{', '.join(map(str, args.callers))}, {args.rounds} rounds of {args.seconds:g} s a step",
        flush=True,
    )
    rng = np.random.default_rng(0)
    photos = {name: rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for name, shape in SIZES.items()}
    totals: dict[tuple[str, int, int], list[float]] = {}
    try:
        for r in range(args.rounds):
            for name, pixels in photos.items():
                for callers in args.callers:
                    for threads in (1, POOL) if r % 2 == 0 else (POOL, 1):
                        cv2.setNumThreads(threads)
                        n, wall, cpu = step(pixels, callers, args.seconds)
                        total = totals.setdefault((name, callers, threads), [0, 0.0, 0.0])
                        total[0] += n
                        total[1] += wall
                        total[2] += cpu
            print(f"  round {r + 1}/{args.rounds} done", flush=True)
    finally:
        cv2.setNumThreads(chosen)
    print(f"\n{'photo':10} {'callers':>7} {'OpenCV':>12} {'images/s':>9} {'CPU ms/image':>12}")
    for (name, callers, threads), (n, wall, cpu) in totals.items():
        side = "one thread" if threads == 1 else f"pool ({pool})"
        print(f"{name:10} {callers:7d} {side:>12} {n / wall:9.0f} {cpu / max(n, 1) * 1000:12.3f}")
    print()
    for name in photos:
        for callers in args.callers:
            one, many = totals[name, callers, 1], totals[name, callers, POOL]
            rate = (one[0] / one[1]) / (many[0] / many[1]) if many[0] and one[1] else float("nan")
            cpu = (one[2] / max(one[0], 1)) / (many[2] / max(many[0], 1)) if many[2] else float("nan")
            print(f"{name}, {callers} callers: one thread / pool: {rate:.2f} x images/s, {cpu:.2f} x CPU an image")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
