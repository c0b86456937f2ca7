"""``python -m scripts.bench``: the arguments and the three phases, plan (``scripts.bench.plan``), run
(``scripts.bench.run``: every side interleaved) and report (results.json, tables, plots)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from app.core.settings import MODEL_REPOSITORY, PROJECT_ROOT
from scripts.bench import __doc__ as bench_doc
from scripts.bench.constants import CONCURRENCY, DEFAULT_IMAGE, DEFAULT_OUT, DEFAULT_TEXT, MODELS
from scripts.bench.fixed_cost import FIXED_COST_CONCURRENCY, fixed_cost_figures, format_fixed_cost
from scripts.bench.load import Progress
from scripts.bench.peers import write_bench_repositories
from scripts.bench.perf import format_perf_checks
from scripts.bench.plan import Plan, make_plan
from scripts.bench.report import format_figures, format_results, plot, target_figures
from scripts.bench.run import Findings, run_against_stack, run_own_stack
from scripts.bench.sized_counts import format_sizing, run_sizing


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench",
        description=bench_doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default="127.0.0.1:8080", help="the product's public host:port (NGINX)")
    p.add_argument("--triton-grpc", default="127.0.0.1:8001", help="the stack's Triton gRPC host:port (side B)")
    p.add_argument(
        "--repository",
        type=Path,
        default=Path(os.environ.get(MODEL_REPOSITORY) or PROJECT_ROOT / "models"),
        help="the model repository the stack serves (the peer Triton and the benchmark's own stack load the same)",
    )
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma-separated levels")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--step-seconds", type=float, default=2.0, help="seconds of load per side per round")
    p.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured load per side before a model")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one request may take")
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="the JPEG sent to the image models")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the text sent to the fill-mask model")
    p.add_argument("--no-peer", action="store_true", help="skip C (the peer Triton)")
    p.add_argument(
        "--no-identity",
        action="store_true",
        help="skip the benchmark's own stack (identity model, start time, worker memory)",
    )
    p.add_argument(
        "--rss-requests",
        type=int,
        default=1000,
        help="mixed requests sent to the benchmark's own stack before reading a router worker's memory",
    )
    p.add_argument("--no-perf-analyzer", action="store_true", help="skip the perf_analyzer cross-check of B")
    p.add_argument(
        "--placements-only",
        action="store_true",
        help="only P-triton, P-router and a detector's P-pystep (the placements of the image pipelines) on the "
        "benchmark's own "
        "stack: no stack on --url needed",
    )
    p.add_argument(
        "--fixed-cost-only",
        action="store_true",
        help="only the fixed-cost section (the router's CPU per request against a bare Flask app on the same "
        "gunicorn and NGINX) on the benchmark's own stack: no stack on --url needed",
    )
    p.add_argument("--no-fixed-cost", action="store_true", help="skip the fixed-cost section")
    p.add_argument(
        "--sizing-only",
        action="store_true",
        help="only the sizing section (the image models' Triton pipelines in two Tritons side by side: the "
        "repository as serve sizes it for this machine against every instance count 1): no stack on --url needed",
    )
    p.add_argument("--no-sizing", action="store_true", help="skip the sizing section")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results.json, plots and logs go here")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: concurrency 1 and 8, one round of 1 s steps, short warm-up"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.rounds, args.step_seconds, args.warmup_seconds = "1,8", 1, 1.0, 0.5
        args.rss_requests = min(args.rss_requests, 60)
    return args


def _stack_ready(url: str, host: str, port: int) -> bool:
    """Is the stack up? A clear message beats a table of errors."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("GET", "/ping")
        status = conn.getresponse().status
    except OSError as error:
        print(f"no stack answers on {url} ({error}): start it with `make run`, or pass --url", file=sys.stderr)
        return False
    if status != 200:
        print(f"{url}/ping answers {status}: the stack is not ready", file=sys.stderr)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Plan (which sections, how many steps), run (against the running stack, then on the benchmark's
    own stack, then the sizing), report (results.json, the tables, the plots)."""
    args = parse_args(argv)
    plan = make_plan(args)
    if plan is None or (plan.against and not _stack_ready(args.url, plan.host, plan.port)):
        return 2
    plan.runtime.mkdir(parents=True, exist_ok=True)
    progress = Progress(plan.steps)
    print(
        f"benchmark: {', '.join(plan.models)} at concurrency {plan.concurrencies}, {args.rounds} rounds of "
        f"{args.step_seconds:g} s steps ({plan.steps} steps); product at {args.url}, Triton gRPC at "
        f"{args.triton_grpc}, repository {plan.repository}",
        flush=True,
    )
    # the sizing section alone needs neither
    repositories = (
        write_bench_repositories(plan.out, plan.repository, plan.specs)
        if plan.own_stack or plan.against
        else (plan.out, plan.out)
    )
    (plan.out / "processes.log").write_bytes(b"")
    found = Findings()
    run_against_stack(plan, args, repositories, found, progress)
    if plan.own_stack:
        run_own_stack(plan, args, repositories[0], found, progress)
    if plan.sizing:
        found.sized = run_sizing(plan.repository, plan.specs, args, plan.out, progress)
    report(args, plan, found)
    return 0


def report(args: argparse.Namespace, plan: Plan, found: Findings) -> None:
    """results.json, then the tables of each section that ran, the notes and the plots' paths."""
    results = {
        model: {side: {c: cell.summary() for c, cell in by_c.items()} for side, by_c in sides.items()}
        for model, sides in found.cells.items()
    }
    figures = target_figures(results, found.extras, found.wire) + fixed_cost_figures(found.fixed)
    record = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "perf_analyzer_check": found.perf,
        "extras": found.extras,
        "bytes_per_request": found.wire,
        "fixed_cost": found.fixed,
        "sizing": found.sized,
        "figures": [{**asdict(f), "passed": f.passed, "mark": f.mark} for f in figures],
        "notes": found.notes,
    }
    (plan.out / "results.json").write_text(json.dumps(record, indent=2, default=str))
    plots = plot(results, plan.out)
    sections = [
        (results, lambda: format_results(results)),
        (found.sized, lambda: format_sizing(found.sized)),
        (found.fixed, lambda: format_fixed_cost(found.fixed, FIXED_COST_CONCURRENCY)),
        (found.perf, lambda: format_perf_checks(found.perf)),
        (any(f.passed is not None for f in figures), lambda: format_figures(figures)),
    ]
    for ran, text in sections:
        if ran:
            print("\n" + text())
    for note in found.notes:
        print(f"note: {note}")
    print(f"\nwrote {plan.out / 'results.json'}" + "".join(f", {p}" for p in plots))


if __name__ == "__main__":
    sys.exit(main())
