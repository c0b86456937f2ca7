"""The benchmark's plan: which sections run, against which models and concurrencies, and how many
steps that takes (the progress line counts them) — decided once from the arguments, before anything
is started."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scripts.bench.fixed_cost import FIXED_COST_CONCURRENCIES, FIXED_COST_ROWS
from scripts.bench.placement import placement_sides
from scripts.bench.sized_counts import sizing_steps


@dataclass(frozen=True)
class Plan:
    models: list[str]
    concurrencies: list[int]
    repository: Path
    out: Path
    image: bytes
    host: str
    port: int
    specs: dict[str, Any]
    placements: dict[str, Any]
    own_only: bool  # only sections on the benchmark's own stack
    only: bool  # only the sections named
    against: list[str]  # the models whose A, B, C sides run against the running stack
    own_stack: bool
    sizing: bool
    fixed_cost: bool
    steps: int

    @property
    def runtime(self) -> Path:
        return self.out / "runtime"


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def make_plan(args: argparse.Namespace) -> Plan | None:
    """The plan for the arguments; None (with the reason printed) when the sample image is missing."""
    from clients.families import load_spec

    if not args.image.is_file():
        print(f"{args.image} not found: run `make samples`, or pass --image", file=sys.stderr)
        return None
    models = [m for m in args.models.split(",") if m]
    repository = args.repository.resolve()
    specs = {m: load_spec(repository / m) for m in models}
    own_only = args.placements_only or args.fixed_cost_only
    only = own_only or args.sizing_only
    own_stack = own_only or not (only or args.no_identity)
    host, port = host_port(args.url)
    chosen = Plan(
        models=models,
        concurrencies=[int(c) for c in args.concurrency.split(",") if c],
        repository=repository,
        out=args.out,
        image=args.image.read_bytes(),
        host=host,
        port=port,
        specs=specs,
        placements=placement_sides(specs),
        own_only=own_only,
        only=only,
        against=[] if only else models,
        own_stack=own_stack,
        sizing=args.sizing_only or not (only or args.no_sizing),
        fixed_cost=own_stack and not args.placements_only and not args.no_fixed_cost,
        steps=0,
    )
    return replace(chosen, steps=count_steps(chosen, args))


def count_steps(plan: Plan, args: argparse.Namespace) -> int:
    """How many steps the sections of the plan take (a step: one side at one concurrency, one round)."""
    rounds, concurrencies = args.rounds, len(plan.concurrencies)
    sides_per_model = 2 + 1 + (0 if args.no_peer else 2)
    steps = len(plan.against) * concurrencies * rounds * sides_per_model
    steps += 0 if args.no_peer or "resnet" not in plan.against else concurrencies * rounds
    if plan.own_stack:
        identity = 0 if plan.own_only else 3
        placed = 0 if args.fixed_cost_only else sum(len(s) for s in plan.placements.values())
        steps += concurrencies * rounds * (identity + placed)
    steps += rounds * (2 + len(FIXED_COST_ROWS)) if plan.fixed_cost else 0  # the two floors and the rows
    # The fixed-cost section alone still measures identity's A-raw against B (latency at c=1, throughput at c=8).
    steps += rounds * 2 * len(FIXED_COST_CONCURRENCIES) if args.fixed_cost_only else 0
    steps += sizing_steps(plan.specs, rounds) if plan.sizing else 0
    return steps
