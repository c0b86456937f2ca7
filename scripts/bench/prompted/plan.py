"""What the prompted benchmark measures, decided before anything starts: its arguments, the families it
serves (SAM, SAM-HQ, OWLv2, Grounding DINO, and the chain of a detector and SAM where the family is in
the tree), its rows (each family's reference in this process at batch 1 and the endpoint at
concurrency 4 on the same images; SAM and SAM-HQ with 1 box and with 8), the comparisons they feed,
and each image's prompts."""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import PROJECT_ROOT
from scripts.bench.generation.plan import env_entry
from scripts.terminal import positive

DEFAULT_OUT = PROJECT_ROOT / "build" / "bench-prompted"
SAM, SAM_HQ, OWLV2, GDINO, CHAIN = "sam", "sam_hq", "owlv2", "gdino", "chain"
FAMILIES = (SAM, SAM_HQ, OWLV2, GDINO, CHAIN)
BOXED = (SAM, SAM_HQ)  # the mask_generation rows: boxes a request
CHAIN_FAMILY = "grounded_segmentation"  # the chain's family: its rows run only where it is registered
# The model serving each family in the benchmark's repository: realistic, and --small's.
MODELS = {SAM: "bench_sam", SAM_HQ: "bench_samhq", OWLV2: "bench_owlv2", GDINO: "bench_gdino", CHAIN: "bench_chain"}
SMALL_MODELS = {SAM: "sam_tiny", SAM_HQ: "samhq_tiny", OWLV2: "owlv2_tiny", GDINO: "gdino_tiny", CHAIN: "chain_tiny"}
REFERENCE, ENDPOINT = "reference", "endpoint"
CONCURRENCY, IMAGES, ROUNDS = 4, 4, 2
FEW, MANY = 1, 8  # SAM's (SAM-HQ's) boxes a request
GOAL_SPEED = 1.0  # the endpoint at concurrency 4 against the reference at batch 1, images/s: at least
GOAL_BOXES = 1.3  # a SAM (SAM-HQ) request's time with 8 boxes against with 1, at concurrency 4: at most
BOXES_GOAL = "boxes"  # the verdicts' key of that comparison, after the family's: "sam boxes"
LABELS = ("a dog", "a person", "a car", "a bird")  # OWLv2's queries
PROMPT = "a dog. a person. a car. a bird."  # Grounding DINO's prompt: the same four
PHOTOS = ("dog", "person", "horses", "eagle", "giraffe", "kite")  # build/samples/<name>.jpg (make samples)
SAMPLES = PROJECT_ROOT / "build" / "samples"
PROG = "python -m scripts.bench.prompted"
DESCRIPTION = (
    "The prompted image families through the public port at concurrency 4 against their Hugging Face "
    "references in one process (processor, model, post-processing, batch 1), images/s on the same photos: "
    "SAM (sam-vit-base), SAM-HQ (sam-hq-vit-base), OWLv2 (base, 960 px) and Grounding DINO (tiny) at their real "
    "sizes, random weights."
)


@dataclass(frozen=True)
class Row:
    """One measured row: a family's ``reference`` in this process, one image a call, or its ``endpoint``
    through the public port at ``concurrency`` client threads; ``boxes``: SAM's (SAM-HQ's) boxes a
    request (the chain's SAM takes the detector's boxes)."""

    family: str
    side: str
    concurrency: int = 1
    boxes: int = 0

    @property
    def key(self) -> str:
        shown = f"/{self.boxes} box{'es' if self.boxes > 1 else ''}" if self.boxes else ""
        return f"{self.family}/{self.side}{shown}" + (f"/c{self.concurrency}" if self.side == ENDPOINT else "")

    def label(self, models: dict[str, str]) -> str:
        what = {SAM: "SAM", SAM_HQ: "SAM-HQ", OWLV2: "OWLv2", GDINO: "Grounding DINO", CHAIN: "Grounding DINO -> SAM"}[
            self.family
        ]
        shown = f", {self.boxes} box{'es' if self.boxes > 1 else ''}" if self.boxes else ""
        if self.side == REFERENCE:
            how = "one after the other" if self.family == CHAIN else "processor, model, post-processing"
            return f"{what}{shown}: reference, batch 1, one process ({how})"
        return f"{what}{shown}: endpoint {models[self.family]}, c={self.concurrency}"


def plan_rows(families: Sequence[str], concurrency: int) -> list[Row]:
    """Per family: the reference and the endpoint; SAM's (SAM-HQ's) endpoint with 1 box and with 8 (its
    reference with 1: the comparison's); the chain's reference is Grounding DINO's then SAM's on its boxes."""
    rows: list[Row] = []
    for family in families:
        boxes = FEW if family in BOXED else 0
        rows += [Row(family, REFERENCE, 1, boxes), Row(family, ENDPOINT, concurrency, boxes)]
        if family in BOXED:
            rows.append(Row(family, ENDPOINT, concurrency, MANY))
    return rows


def goal_rows(families: Sequence[str], concurrency: int) -> dict[str, tuple[Row, Row]]:
    """The comparisons the verdicts make, by family: (the measured row, its reference); "<family>
    boxes": SAM (SAM-HQ) with 8 boxes against 1."""
    found = {}
    for family in families:
        boxes = FEW if family in BOXED else 0
        found[family] = (Row(family, ENDPOINT, concurrency, boxes), Row(family, REFERENCE, 1, boxes))
    for family in (family for family in BOXED if family in families):
        found[f"{family} {BOXES_GOAL}"] = (
            Row(family, ENDPOINT, concurrency, MANY),
            Row(family, ENDPOINT, concurrency, FEW),
        )
    return found


def boxes_of(width: int, height: int, count: int, seed: int) -> list[list[float]]:
    """``count`` seeded boxes inside a ``width`` x ``height`` image, each a tenth to a half of each side."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        w, h = rng.uniform(0.1, 0.5) * width, rng.uniform(0.1, 0.5) * height
        x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
        found.append([round(x, 1), round(y, 1), round(x + w, 1), round(y + h, 1)])
    return found


def parse_families(value: str) -> list[str]:
    chosen = [family for family in value.split(",") if family]
    unknown = sorted(set(chosen) - set(FAMILIES))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'none given'}; choose from {', '.join(FAMILIES)}")
    return [family for family in FAMILIES if family in chosen]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--out", type=Path, default=DEFAULT_OUT, help="results.json, the model sources, the cache and logs go here")
    add("--repository", type=Path, help="the repository to prepare and serve (default: OUT/repository)")
    add("--no-prepare", action="store_true", help="serve --repository as it is (it holds the families' models)")
    add("--small", action="store_true", help="the small-model sets' tiny models (scripts.model_prep.small_models)")
    add("--families", type=parse_families, default=list(FAMILIES), help=f"comma-separated: {', '.join(FAMILIES)}")
    add("--images", type=positive(int), default=IMAGES, help="images a row a round (the sample photos, cycled)")
    add("--rounds", type=positive(int), default=ROUNDS, help="interleaved rounds")
    add("--warmup", type=positive(int, zero=True), default=1, help="unmeasured calls a client thread, each row first")
    add("--concurrency", type=positive(int), default=CONCURRENCY, help="client threads of the endpoint's rows")
    add(
        "--reference-threads",
        type=positive(int),
        help="PyTorch's threads for the references in this process (default: PyTorch's own, every CPU)",
    )
    add(
        "--env",
        type=env_entry,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for serve",
    )
    add("--timeout", type=float, default=600.0, help="seconds one request may take (the router's deadlines too)")
    add("--quick", action="store_true", help="fewer images: one round, as many images a row as --concurrency")
    args = p.parse_args(argv)
    if args.quick:  # as many images as client threads: the endpoint's rows still have them all in flight
        args.rounds, args.images = 1, args.concurrency
    args.repository = (args.repository or args.out / "repository").resolve()
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as results.json records it
    return args
