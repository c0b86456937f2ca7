"""``python -m scripts.bench``: the arguments, the interleaved run of every side, and the report."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.core.settings import MODEL_REPOSITORY, PROJECT_ROOT
from scripts.bench import __doc__ as bench_doc
from scripts.bench.constants import (
    CONCURRENCY,
    DEFAULT_IMAGE,
    DEFAULT_OUT,
    DEFAULT_TEXT,
    IDENTITY,
    IDENTITY_TEXT,
    MODELS,
    NOBATCH_SUFFIX,
    PYSTEP_SIDE,
    TRITON_SIDE,
)
from scripts.bench.fixed_cost import (
    FIXED_COST_CONCURRENCIES,
    FIXED_COST_CONCURRENCY,
    FIXED_COST_ROWS,
    fixed_cost_figures,
    format_fixed_cost,
    run_fixed_cost,
)
from scripts.bench.load import GrpcCaller, HttpCaller, Progress, bench_model, send_mixed
from scripts.bench.payloads import grpc_request, peer_requests, preprocessed_tensors, product_requests
from scripts.bench.peers import (
    rss_mb,
    start_own_stack,
    start_peer,
    write_bench_repositories,
)
from scripts.bench.perf import format_perf_checks, perf_analyzer_check
from scripts.bench.placement import CpuMeter, placement_sides, wire_bytes
from scripts.bench.report import Cell, format_figures, format_results, plot, target_figures
from scripts.bench.sizing import format_sizing, run_sizing, sizing_steps


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


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def bench_placements(
    stack,
    specs: Mapping[str, Any],
    placements: Mapping[str, Sequence[tuple[str, str]]],
    concurrencies: Sequence[int],
    image: bytes,
    args,
    cells: dict,
    progress: Progress,
    wire: dict,
) -> None:
    """Both placements of each image model's processing on the benchmark's own stack
    (``scripts.bench.placement``), with the CPU of its processes and the bytes to and from Triton."""
    from app.core.pipeline import ROUTER, TRITON
    from app.core.spec import load_spec

    meter = CpuMeter(stack)
    grpc_url = f"127.0.0.1:{stack.triton_ports[1]}"
    for model, sides in placements.items():
        spec = specs[model]
        callers = {
            side: HttpCaller(
                product_requests(name, spec.family, "127.0.0.1", stack.port, image, args.text)["A-raw"], args.timeout
            )
            for side, name in sides
        }
        bench_model(model, callers, concurrencies, args, cells, progress, meter)
        item = args.text if spec.family == "fill_mask" else image
        for side, name in sides:
            if side == PYSTEP_SIDE:  # the same ensemble tensors as P-triton's, by construction
                continue
            # P-router calls its own copy (for a detector, the raw network), not the served model's network
            served = spec if name == model else load_spec(stack.repository / name)
            sent, received = wire_bytes(served, item, grpc_url, TRITON if side == TRITON_SIDE else ROUTER)
            wire.setdefault(model, {})[side] = {
                "to_triton": sent,
                "from_triton": received,
                "input": len(item if isinstance(item, bytes) else item.encode()),
            }


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
    args = parse_args(argv)
    from app.core.spec import load_spec

    models = [m for m in args.models.split(",") if m]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    repository = args.repository.resolve()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    runtime = out / "runtime"
    runtime.mkdir(exist_ok=True)
    if not args.image.is_file():
        print(f"{args.image} not found: run `make samples`, or pass --image", file=sys.stderr)
        return 2
    image = args.image.read_bytes()
    a_host, a_port = _host_port(args.url)
    specs = {m: load_spec(repository / m) for m in models}

    own_only = args.placements_only or args.fixed_cost_only  # only sections on the benchmark's own stack
    only = own_only or args.sizing_only  # only the sections named
    if not only and not _stack_ready(args.url, a_host, a_port):
        return 2
    against = [] if only else models  # the models whose A, B, C sides run
    own_stack = own_only or not (only or args.no_identity)
    sizing = args.sizing_only or not (only or args.no_sizing)
    fixed_cost = own_stack and not args.placements_only and not args.no_fixed_cost

    sides_per_model = 2 + 1 + (0 if args.no_peer else 2)
    steps = len(against) * len(concurrencies) * args.rounds * sides_per_model
    steps += 0 if args.no_peer or "resnet" not in against else len(concurrencies) * args.rounds
    placements = placement_sides(specs)
    steps += (
        0
        if not own_stack
        else len(concurrencies)
        * args.rounds
        * ((0 if own_only else 3) + (0 if args.fixed_cost_only else sum(len(s) for s in placements.values())))
    )
    steps += args.rounds * (2 + len(FIXED_COST_ROWS)) if fixed_cost else 0  # the two floors and the rows
    # The fixed-cost section alone still measures identity's A-raw against B (latency at c=1, throughput at c=8).
    steps += args.rounds * 2 * len(FIXED_COST_CONCURRENCIES) if args.fixed_cost_only else 0
    steps += sizing_steps(specs, args.rounds) if sizing else 0
    progress = Progress(steps)
    print(
        f"benchmark: {', '.join(models)} at concurrency {concurrencies}, {args.rounds} rounds of "
        f"{args.step_seconds:g} s steps ({steps} steps); product at {args.url}, Triton gRPC at {args.triton_grpc}, "
        f"repository {repository}",
        flush=True,
    )

    # the sizing section alone needs neither
    stack_repo, nobatch_repo = write_bench_repositories(out, repository, specs) if own_stack or against else (out, out)
    cells: dict[str, dict[str, dict[str, Cell]]] = {}
    notes: list[str] = []
    extras: dict[str, float | None] = {}
    wire: dict[str, dict[str, dict[str, int]]] = {}
    perf: dict[str, Any] = {}
    fixed: dict[str, dict[str, Any]] = {}
    sized: dict[str, Any] = {}
    log_path = out / "processes.log"
    log_path.write_bytes(b"")

    for model in against:
        spec = specs[model]
        tensors, outputs = preprocessed_tensors(spec, args.image, args.text)
        callers: dict[str, Callable[[], None]] = {
            side: HttpCaller(r, args.timeout)
            for side, r in product_requests(model, spec.family, a_host, a_port, image, args.text).items()
        }
        closers = [GrpcCaller(args.triton_grpc, grpc_request(model, tensors, outputs), args.timeout)]
        callers["B"] = closers[0]
        peer = None
        if not args.no_peer:
            extra_models = [f"resnet{NOBATCH_SUFFIX}"] if model == "resnet" else []
            print(f"starting the peer Triton (SageMaker front end) for {model} ...", flush=True)
            began = time.monotonic()
            peer = start_peer(
                model, [repository, nobatch_repo] if extra_models else [repository], extra_models, runtime, log_path
            )
            print(f"  ready after {time.monotonic() - began:.1f} s, SageMaker port {peer.sagemaker_port}", flush=True)
            for side, r in peer_requests("127.0.0.1", peer.sagemaker_port, tensors, outputs).items():
                callers[side] = HttpCaller(r, args.timeout)
            if extra_models:
                nobatch = GrpcCaller(peer.grpc_url, grpc_request(extra_models[0], tensors, outputs), args.timeout)
                closers.append(nobatch)
                callers["B-nobatch"] = nobatch
        try:
            bench_model(model, callers, concurrencies, args, cells, progress)
            if not args.no_perf_analyzer:
                perf[model] = perf_analyzer_check(model, callers["B"], args, out)
        finally:
            for closer in closers:
                closer.close()
            if peer is not None:
                peer.stop()

    if own_stack:
        print("starting the benchmark's own stack (identity model + the served models) ...", flush=True)
        stack = start_own_stack(stack_repo, out)
        extras["start_to_ping_s"] = stack.start_to_ping_s
        print(f"  /ping 200 after {stack.start_to_ping_s:.1f} s on port {stack.port}", flush=True)
        try:
            spec = load_spec(stack_repo / IDENTITY)
            tensors, _ = preprocessed_tensors(spec, args.image, IDENTITY_TEXT)
            callers = {
                side: HttpCaller(r, args.timeout)
                for side, r in product_requests(
                    IDENTITY, spec.family, "127.0.0.1", stack.port, b"", IDENTITY_TEXT
                ).items()
            }
            b = GrpcCaller(
                f"127.0.0.1:{stack.triton_ports[1]}",
                grpc_request(IDENTITY, tensors, [t.name for t in spec.outputs]),
                args.timeout,
            )
            callers["B"] = b
            try:
                if not own_only:
                    bench_model(IDENTITY, callers, concurrencies, args, cells, progress)
                elif args.fixed_cost_only:
                    sides = {side: callers[side] for side in ("A-raw", "B")}
                    bench_model(IDENTITY, sides, FIXED_COST_CONCURRENCIES, args, cells, progress)
            finally:
                b.close()
            if args.rss_requests > 0 and not own_only:
                mixed = [
                    HttpCaller(r, args.timeout)
                    for m in models
                    for r in product_requests(m, specs[m].family, "127.0.0.1", stack.port, image, args.text).values()
                ]
                print(
                    f"{args.rss_requests} mixed requests ({', '.join(models)}; JSON and raw body) for the "
                    f"router's memory ...",
                    flush=True,
                )
                errors = send_mixed(mixed, args.rss_requests, concurrency=4)
                if errors:
                    notes.append(f"{errors} of the {args.rss_requests} mixed requests failed")
            if not own_only:  # before the router-pipeline copies' large tensors pass through
                workers = stack.router_workers()
                sizes = [s for s in (rss_mb(pid) for pid in workers) if s is not None]
                extras["worker_rss_mb"] = max(sizes) if sizes else None
                notes.append(
                    f"router worker RSS on the benchmark's own stack after the identity steps and "
                    f"{args.rss_requests} mixed requests: {', '.join(f'{s:.0f} MB' for s in sizes)} "
                    f"(workers {workers}); the largest is the figure"
                )
            if fixed_cost:
                print(
                    "fixed cost: starting the floor (a bare Flask app on the router's gunicorn and NGINX) ...",
                    flush=True,
                )
                fixed = run_fixed_cost(stack, tensors, image, args.text, out, models, args, progress.step)
            if not args.fixed_cost_only:
                bench_placements(stack, specs, placements, concurrencies, image, args, cells, progress, wire)
        finally:
            stack.stop()

    if sizing:
        sized = run_sizing(repository, specs, args, out, progress)

    results = {
        model: {side: {c: cell.summary() for c, cell in by_c.items()} for side, by_c in sides.items()}
        for model, sides in cells.items()
    }
    figures = target_figures(results, extras, wire) + fixed_cost_figures(fixed)
    checks = perf
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "perf_analyzer_check": checks,
        "extras": extras,
        "bytes_per_request": wire,
        "fixed_cost": fixed,
        "sizing": sized,
        "figures": [{**asdict(f), "passed": f.passed, "mark": f.mark} for f in figures],
        "notes": notes,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    plots = plot(results, out)

    if results:
        print("\n" + format_results(results))
    if sized:
        print("\n" + format_sizing(sized))
    if fixed:
        print("\n" + format_fixed_cost(fixed, FIXED_COST_CONCURRENCY))
    if checks:
        print("\n" + format_perf_checks(checks))
    if any(f.passed is not None for f in figures):
        print("\n" + format_figures(figures))
    for note in notes:
        print(f"note: {note}")
    print(f"\nwrote {out / 'results.json'}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
