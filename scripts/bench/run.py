"""The benchmark's measuring phase: each model's sides against the running stack (with the peer
Triton's SageMaker front end), then the sections on the benchmark's own stack (identity, the
router's memory, the fixed cost, both placements of each image model). What they find goes into one
``Findings``, which the report reads."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench.constants import IDENTITY, IDENTITY_TEXT, NOBATCH_SUFFIX, PYSTEP_SIDE, TRITON_SIDE
from scripts.bench.fixed_cost import FIXED_COST_CONCURRENCIES, run_fixed_cost
from scripts.bench.load import GrpcCaller, HttpCaller, Progress, bench_model, send_mixed
from scripts.bench.payloads import grpc_request, peer_requests, preprocessed_tensors, product_requests, takes_text
from scripts.bench.peers import rss_mb, start_own_stack, start_peer
from scripts.bench.perf import perf_analyzer_check
from scripts.bench.placement import CpuMeter, wire_bytes
from scripts.bench.plan import Plan


@dataclass
class Findings:
    """What the sections measured, by section."""

    cells: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extras: dict[str, float | None] = field(default_factory=dict)
    wire: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    perf: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, dict[str, Any]] = field(default_factory=dict)
    sized: dict[str, Any] = field(default_factory=dict)


def run_against_stack(
    plan: Plan, args: argparse.Namespace, repositories: tuple[Path, Path], found: Findings, progress: Progress
) -> None:
    """Each model's A (the product), B (Triton over gRPC) and C (the peer) sides."""
    repository, nobatch_repo = plan.repository, repositories[1]
    log_path = plan.out / "processes.log"
    for model in plan.against:
        spec = plan.specs[model]
        tensors, outputs = preprocessed_tensors(spec, args.image, args.text)
        requests = product_requests(model, spec, plan.host, plan.port, plan.image, args.text)
        callers: dict[str, Callable[[], None]] = {side: HttpCaller(r, args.timeout) for side, r in requests.items()}
        closers = [GrpcCaller(args.triton_grpc, grpc_request(model, tensors, outputs), args.timeout)]
        callers["B"] = closers[0]
        peer = None
        if not args.no_peer:
            extra_models = [f"resnet{NOBATCH_SUFFIX}"] if model == "resnet" else []
            print(f"starting the peer Triton (SageMaker front end) for {model} ...", flush=True)
            began = time.monotonic()
            repositories_used = [repository, nobatch_repo] if extra_models else [repository]
            peer = start_peer(model, repositories_used, extra_models, plan.runtime, log_path)
            print(f"  ready after {time.monotonic() - began:.1f} s, SageMaker port {peer.sagemaker_port}", flush=True)
            for side, r in peer_requests("127.0.0.1", peer.sagemaker_port, tensors, outputs).items():
                callers[side] = HttpCaller(r, args.timeout)
            if extra_models:
                nobatch = GrpcCaller(peer.grpc_url, grpc_request(extra_models[0], tensors, outputs), args.timeout)
                closers.append(nobatch)
                callers["B-nobatch"] = nobatch
        try:
            bench_model(model, callers, plan.concurrencies, args, found.cells, progress)
            if not args.no_perf_analyzer:
                found.perf[model] = perf_analyzer_check(model, callers["B"], args, plan.out)
        finally:
            for closer in closers:
                closer.close()
            if peer is not None:
                peer.stop()


def run_own_stack(plan: Plan, args: argparse.Namespace, stack_repo: Path, found: Findings, progress: Progress) -> None:
    """The sections on the benchmark's own stack, which is started and stopped here."""
    print("starting the benchmark's own stack (identity model + the served models) ...", flush=True)
    stack = start_own_stack(stack_repo, plan.out)
    found.extras["start_to_ping_s"] = stack.start_to_ping_s
    print(f"  /ping 200 after {stack.start_to_ping_s:.1f} s on port {stack.port}", flush=True)
    try:
        tensors = _identity(plan, args, stack, stack_repo, found, progress)
        if not plan.own_only:
            _router_memory(plan, args, stack, found)
        if plan.fixed_cost:
            print(
                "fixed cost: starting the floor (a bare Flask app on the router's gunicorn and NGINX) ...", flush=True
            )
            found.fixed = run_fixed_cost(
                stack, tensors, plan.image, args.text, plan.out, plan.models, args, progress.step
            )
        if not args.fixed_cost_only:
            bench_placements(stack, plan, args, found, progress)
    finally:
        stack.stop()


def _identity(plan: Plan, args, stack, stack_repo: Path, found: Findings, progress: Progress) -> dict[str, Any]:
    """The identity model's sides (the product's fixed cost against Triton's); returns its tensors."""
    from clients.families import load_spec

    spec = load_spec(stack_repo / IDENTITY)
    tensors, _ = preprocessed_tensors(spec, args.image, IDENTITY_TEXT)
    requests = product_requests(IDENTITY, spec, "127.0.0.1", stack.port, b"", IDENTITY_TEXT)
    callers = {side: HttpCaller(r, args.timeout) for side, r in requests.items()}
    b = GrpcCaller(
        f"127.0.0.1:{stack.triton_ports[1]}",
        grpc_request(IDENTITY, tensors, [t.name for t in spec.outputs]),
        args.timeout,
    )
    callers["B"] = b
    try:
        if not plan.own_only:
            bench_model(IDENTITY, callers, plan.concurrencies, args, found.cells, progress)
        elif args.fixed_cost_only:
            sides = {side: callers[side] for side in ("A-raw", "B")}
            bench_model(IDENTITY, sides, FIXED_COST_CONCURRENCIES, args, found.cells, progress)
    finally:
        b.close()
    return tensors


def _router_memory(plan: Plan, args, stack, found: Findings) -> None:
    """The router workers' resident memory after mixed requests (before the placement copies' large
    tensors pass through)."""
    if args.rss_requests > 0:
        mixed = [
            HttpCaller(r, args.timeout)
            for m in plan.models
            for r in product_requests(m, plan.specs[m], "127.0.0.1", stack.port, plan.image, args.text).values()
        ]
        print(
            f"{args.rss_requests} mixed requests ({', '.join(plan.models)}; JSON and raw body) for the "
            f"router's memory ...",
            flush=True,
        )
        errors = send_mixed(mixed, args.rss_requests, concurrency=4)
        if errors:
            found.notes.append(f"{errors} of the {args.rss_requests} mixed requests failed")
    workers = stack.router_workers()
    sizes = [s for s in (rss_mb(pid) for pid in workers) if s is not None]
    found.extras["worker_rss_mb"] = max(sizes) if sizes else None
    found.notes.append(
        f"router worker RSS on the benchmark's own stack after the identity steps and "
        f"{args.rss_requests} mixed requests: {', '.join(f'{s:.0f} MB' for s in sizes)} "
        f"(workers {workers}); the largest is the figure"
    )


def bench_placements(stack, plan: Plan, args, found: Findings, progress: Progress) -> None:
    """Both placements of each image model's processing on the benchmark's own stack
    (``scripts.bench.placement``), with the CPU of its processes and the bytes to and from Triton."""
    from app.core.pipeline import ROUTER, TRITON
    from clients.families import load_spec

    meter = CpuMeter(stack)
    grpc_url = f"127.0.0.1:{stack.triton_ports[1]}"
    for model, sides in plan.placements.items():
        spec = plan.specs[model]
        callers = {
            side: HttpCaller(
                product_requests(name, spec, "127.0.0.1", stack.port, plan.image, args.text)["A-raw"],
                args.timeout,
            )
            for side, name in sides
        }
        bench_model(model, callers, plan.concurrencies, args, found.cells, progress, meter)
        item = args.text if takes_text(spec) else plan.image
        for side, name in _measured_sides(sides):
            # P-router calls its own copy (for a detector, the raw network), not the served model's network
            served = spec if name == model else load_spec(stack.repository / name)
            sent, received = wire_bytes(served, item, grpc_url, TRITON if side == TRITON_SIDE else ROUTER)
            found.wire.setdefault(model, {})[side] = {
                "to_triton": sent,
                "from_triton": received,
                "input": len(item if isinstance(item, bytes) else item.encode()),
            }


def _measured_sides(sides: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The sides whose bytes to Triton are measured: the python-step side sends the same ensemble
    tensors as P-triton's, by construction."""
    return [(side, name) for side, name in sides if side != PYSTEP_SIDE]
