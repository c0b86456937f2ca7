"""The cross-check of side B: Triton's own perf_analyzer against the benchmark's gRPC client."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scripts.bench.constants import PERF_CONCURRENCY
from scripts.bench.load import run_load
from scripts.bench.report import Cell


def perf_analyzer_env(out: Path) -> tuple[str, dict[str, str]] | None:
    """The binary of the tritonclient wheel and an environment where it finds libb64 and
    libcudart (both in nvidia_pytriton.libs under hashed names: a directory of links)."""
    binary = shutil.which("perf_analyzer", path=str(Path(sys.executable).parent))
    if binary is None:
        return None
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "nvidia_pytriton.libs"
    links = out / "perf_analyzer-libs"
    links.mkdir(parents=True, exist_ok=True)
    for prefix, name in (("libb64-", "libb64.so.0d"), ("libcudart-", "libcudart.so.12")):
        found = sorted(libs.glob(f"{prefix}*"))
        if not found:
            return None
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(found[0])
    lib_path = os.pathsep.join(filter(None, [str(links), os.environ.get("LD_LIBRARY_PATH")]))
    env = {**os.environ, "LD_LIBRARY_PATH": lib_path}
    return binary, env


def run_perf_analyzer(
    binary: str, env: Mapping[str, str], url: str, model: str, concurrency: int, requests_per_window: int, out: Path
) -> dict[str, float] | str:
    """perf_analyzer's throughput and p50 at one concurrency (zero-filled inputs), or why not.
    Windows are counted in requests: a window in milliseconds can hold no request at all when
    one takes seconds on a busy machine."""
    csv = out / f"perf_analyzer-{model}-c{concurrency}.csv"
    argv = [
        binary,
        "-m",
        model,
        "-u",
        url,
        "-i",
        "grpc",
        "--concurrency-range",
        str(concurrency),
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(requests_per_window),
        # Three windows within 2x of each other count as stable: the default (10 %) is never met on a
        # shared two-core machine, and perf_analyzer then reports nothing.
        "--input-data",
        "zero",
        "--max-trials",
        "5",
        "--stability-percentage",
        "100",
        "-f",
        str(csv),
    ]
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0 or not csv.is_file():
        return (
            (done.stderr or done.stdout).strip().splitlines()[-1][:300]
            if (done.stderr or done.stdout)
            else f"exit {done.returncode}"
        )
    header, row = csv.read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(",")))
    return {"throughput": float(values["Inferences/Second"]), "p50_ms": float(values["p50 latency"]) / 1000.0}


def perf_analyzer_check(model: str, b_call: Callable[[], None], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """perf_analyzer on the ceiling, with B's own client run just before and just after it (the
    machine drifts: the mean of the two brackets perf_analyzer's figure in time)."""
    found = perf_analyzer_env(out)
    if found is None:
        return {"perf_analyzer": "perf_analyzer not found (tritonclient==2.51.0 carries it)"}
    print(f"perf_analyzer on {model}, c={PERF_CONCURRENCY}, between two runs of B's own client ...", flush=True)
    seconds = max(2.0, 2 * args.step_seconds)
    before = run_load(b_call, PERF_CONCURRENCY, seconds)
    pa = run_perf_analyzer(*found, args.triton_grpc, model, PERF_CONCURRENCY, 16 if args.quick else 48, out)
    after = run_load(b_call, PERF_CONCURRENCY, seconds)
    own = Cell()
    for load in (before, after):
        own.add(load.latencies_s, load.errors, load.window_s, load.work, load.first_error)
    summary = own.summary()
    check: dict[str, Any] = {
        "perf_analyzer": pa,
        "own_client": {k: summary[k] for k in ("throughput", "p50_ms")},
        "own_client_runs": [before.work / before.window_s, after.work / after.window_s],
    }
    if isinstance(pa, dict):
        check["throughput_ratio"] = summary["throughput"] / pa["throughput"]
        print(
            f"  perf_analyzer {pa['throughput']:.1f} req/s, own client {summary['throughput']:.1f} req/s "
            f"({check['own_client_runs'][0]:.1f} before, {check['own_client_runs'][1]:.1f} after)",
            flush=True,
        )
    else:
        print(f"  perf_analyzer gave no figure: {pa}", flush=True)
    return check


def format_perf_checks(checks: Mapping[str, Mapping[str, Any]]) -> str:
    """B's own client against perf_analyzer, one line per model."""
    lines = [f"B's client against perf_analyzer, c={PERF_CONCURRENCY} (own client run just before and just after):"]
    for model, check in checks.items():
        pa = check["perf_analyzer"]
        if isinstance(pa, dict):
            own = check["own_client"]
            lines.append(
                f"  {model}: perf_analyzer {pa['throughput']:.1f} req/s p50 {pa['p50_ms']:.1f} ms; own client "
                f"{own['throughput']:.1f} req/s p50 {own['p50_ms']:.1f} ms (own / perf_analyzer "
                f"{check['throughput_ratio']:.2f})"
            )
        else:
            lines.append(f"  {model}: perf_analyzer gave no figure: {pa}")
    return "\n".join(lines)
