"""``python -m scripts.bench.prompted``: prepare the repository, load the references, start one stack,
check each endpoint row once, measure every row interleaved round by round, then report
(``scripts.bench.prompted.report``)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.settings import SERVER_TIMEOUT, TRITON_TIMEOUT
from scripts.bench.generation.run import own_and_machine
from scripts.bench.generation.stack_side import serving, sizing_line
from scripts.bench.load import HttpCaller, Progress, run_calls
from scripts.bench.payloads import HttpRequest
from scripts.bench.placement import CpuMeter
from scripts.bench.prompted import plan, prepare, report
from scripts.bench.prompted.plan import BOXED, CHAIN, GDINO, MANY, OWLV2, SAM, Row
from scripts.bench.prompted.references import SamReference, ZsdReference
from scripts.bench.report import Cell, write_results
from scripts.bench.text.plan import schedule
from scripts.bench.text.report import noise_lines
from scripts.bench.text.run import JSON_HEADERS
from scripts.devtools import Stack


@dataclass(frozen=True)
class Photo:
    name: str
    data: bytes  # the JPEG, as the endpoint gets it
    image: Any  # the decoded RGB image, as the reference gets it
    boxes: list[list[float]]  # SAM's (SAM-HQ's) 8 boxes (the 1-box rows take the first)


def photos() -> list[Photo]:
    """The sample photos (build/samples, ``make samples``), decoded, each with its seeded boxes."""
    from PIL import Image

    found = []
    for seed, name in enumerate(plan.PHOTOS):
        path = plan.SAMPLES / f"{name}.jpg"
        if not path.is_file():
            raise SystemExit(f"{path} not found: run `make samples`")
        data = path.read_bytes()
        image = Image.open(io.BytesIO(data)).convert("RGB")
        found.append(Photo(name, data, image, plan.boxes_of(image.width, image.height, MANY, seed)))
    return found


def payload(row: Row, photo: Photo, chain_thresholds: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The row's payload for one photo: SAM's (SAM-HQ's) boxes, OWLv2's labels, Grounding DINO's prompt
    (the chain's with the photo's threshold)."""
    img = {"img": base64.b64encode(photo.data).decode()}
    if row.family in BOXED:
        return {**img, "boxes": photo.boxes[: row.boxes]}
    if row.family == OWLV2:
        return {**img, "labels": list(plan.LABELS)}
    if row.family == CHAIN:
        return {**img, "text": plan.PROMPT, "threshold": chain_thresholds[photo.name]}
    return {**img, "text": plan.PROMPT}


class References:
    """The references in this process, one per model folder, loaded once; ``call(row, photo)`` answers
    one photo as a caller of transformers would."""

    def __init__(self, folders: Mapping[str, Path], threads: int | None) -> None:
        self.segmenters = {f: SamReference(folders[f], threads) for f in BOXED if f in folders}
        self.detectors = {f: ZsdReference(folders[f], threads) for f in (OWLV2, GDINO) if f in folders}
        self.chain_thresholds: dict[str, float] = {}

    def choose_chain_thresholds(self, shown: Sequence[Photo]) -> dict[str, float]:
        """The chain's box threshold of each photo: half-way between its ``MANY``-th and next best
        scores, so that as many detections as SAM's many-box row sends reach SAM (a random-weight
        detector passes every query at its default; one threshold for all photos passed 3 on one and
        743 on another)."""
        for photo in shown:
            found = self.detectors[GDINO].detect(photo.image, plan.PROMPT, threshold=0.0)
            self.chain_thresholds[photo.name] = (found[MANY - 1]["score"] + found[MANY]["score"]) / 2
        return self.chain_thresholds

    def call(self, row: Row, photo: Photo) -> Any:
        if row.family in BOXED:
            return self.segmenters[row.family].boxes(photo.image, photo.boxes[: row.boxes])
        if row.family == OWLV2:
            return self.detectors[OWLV2].detect(photo.image, plan.LABELS)
        if row.family == CHAIN:  # then SAM with the detector's boxes
            found = self.detectors[GDINO].detect(photo.image, plan.PROMPT, threshold=self.chain_thresholds[photo.name])
            return self.segmenters[SAM].boxes(photo.image, [one["box"] for one in found]) if found else found
        return self.detectors[GDINO].detect(photo.image, plan.PROMPT)


def endpoint_caller(
    port: int, model: str, row: Row, shown: Sequence[Photo], timeout_s: float, chain_thresholds: Mapping[str, float]
) -> HttpCaller:
    bodies = [
        json.dumps({"modelname": model, "payload": payload(row, photo, chain_thresholds)}).encode() for photo in shown
    ]
    return HttpCaller(
        [HttpRequest("127.0.0.1", port, "/invocations", body, JSON_HEADERS) for body in bodies], timeout_s
    )


def calls_of(
    stack: Stack, rows, shown, references: References, models, args
) -> tuple[dict[str, Callable[[int], None]], dict[str, list[int]]]:
    """Each row's call of the i-th photo; each endpoint row checked once: an answer per box for SAM (SAM-HQ);
    for the detectors and the chain, the detections of the first photo, the endpoint's and the
    reference's (random weights: how many boxes pass the threshold is the work both sides do)."""
    found: dict[str, Callable[[int], None]] = {}
    detections: dict[str, list[int]] = {}
    if any(row.family == CHAIN for row in rows):
        thresholds = references.choose_chain_thresholds(shown)
        listed = ", ".join(f"{name} {value:.5f}" for name, value in thresholds.items())
        print(f"  the chain's thresholds, {MANY} detections of each photo passing: {listed}", flush=True)
    for row in rows:
        if row.side == plan.REFERENCE:
            found[row.key] = lambda i, row=row: references.call(row, shown[i % len(shown)])
            continue
        caller = endpoint_caller(stack.port, models[row.family], row, shown, args.timeout, references.chain_thresholds)
        try:
            answer = json.loads(caller.send(caller.requests[0]))["result"]
        except (OSError, http.client.HTTPException, RuntimeError, KeyError, ValueError) as error:
            raise SystemExit(f"{row.key}: {error}") from None
        if row.family in BOXED and len(answer) != row.boxes:
            raise SystemExit(f"{row.key}: {len(answer)} answers to {row.boxes} boxes")
        if row.family not in BOXED:
            served, local = detections[row.family] = [len(answer), len(references.call(row, shown[0]))]
            print(f"  {row.key}: {served} detections of {shown[0].name}, the reference's {local}", flush=True)
        found[row.key] = lambda i, caller=caller: caller.send(caller.requests[i % len(caller.requests)])
    return found, detections


def measure(stack: Stack, rows, shown, references: References, models, args) -> tuple[dict[str, list[Cell]], dict]:
    """Warm every row (``--warmup`` calls a client thread), then the interleaved rounds: each step is
    ``--images`` calls, the photos cycled (the same photos on every row), the CPU read by role around it."""
    calls, detections = calls_of(stack, rows, shown, references, models, args)
    meter = CpuMeter(stack)
    print(f"warming up {len(rows)} rows ({args.warmup} calls a client thread) ...", flush=True)
    for row in rows:  # every thread's calls at once: each of Triton's instances runs its first
        run_calls(
            [lambda i=i, row=row: calls[row.key](i) for i in range(args.warmup * row.concurrency)], row.concurrency
        )
    cells: dict[str, list[Cell]] = {row.key: [] for row in rows}
    steps = schedule(rows, args.rounds)
    progress = Progress(len(steps))
    for r, row in steps:
        before = {**meter(), **own_and_machine()}
        load = run_calls([lambda i=i, row=row: calls[row.key](i) for i in range(args.images)], row.concurrency)
        after = {**meter(), **own_and_machine()}
        cell = Cell()
        cell.add(load.latencies_s, load.errors, load.window_s, load.work, load.first_error)
        cell.cpu_s = {role: after[role] - before[role] for role in after}
        cells[row.key].append(cell)
        progress.step(report.progress_label(r, args.rounds, row, cell), cell.summary())
    return cells, detections


def chain_line(families: Sequence[str]) -> str:
    """Why the chain's rows are skipped (its family is not in this tree), or "" where they run."""
    from clients.families import FAMILIES

    if CHAIN in families and plan.CHAIN_FAMILY not in FAMILIES:
        return f"info chain: the family {plan.CHAIN_FAMILY} is not in this tree: its rows are skipped"
    return ""


def deadlines(timeout_s: float) -> list[tuple[str, str]]:
    """The router's deadlines raised to ``--timeout`` (``--env`` may set them again): at real sizes on
    a few CPUs, an image takes seconds to tens of seconds, and four in flight wait for each other past
    the 30 s Triton is given by default."""
    return [(TRITON_TIMEOUT, f"{timeout_s:g}"), (SERVER_TIMEOUT, f"{timeout_s:g}")]


def main(argv: Sequence[str] | None = None) -> int:
    args = plan.parse_args(argv)
    skipped = chain_line(args.families)
    families = [family for family in args.families if not (family == CHAIN and skipped)]
    if skipped:
        print(skipped, flush=True)
    if not families:
        raise SystemExit("nothing to measure")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    folders = prepare.prepare(out, args.repository, families, args.small, not args.no_prepare)
    models = prepare.models_of(args.small)
    shown = photos()
    print(f"loading the references ({', '.join(f'{f}: {folders[f]}' for f in folders)}) ...", flush=True)
    references = References(folders, args.reference_threads)
    rows = plan.plan_rows(families, args.concurrency)
    with serving(args.repository, args.out, deadlines(args.timeout) + list(args.env)) as stack:
        cells, detections = measure(stack, rows, shown, references, models, args)
        sizing = sizing_line(stack)
    found = report.results(rows, cells, models, args, stack.start_to_ping_s or 0.0)
    found.update(sizing=sizing, folders={f: str(folder) for f, folder in folders.items()}, chain=skipped)
    found["detections_of_the_first_photo"] = detections  # (the endpoint's, the reference's) by family
    write_results(
        args.out / "results.json",
        found,
        report.format_table(found["rows"]),
        report.format_verdicts(found["verdicts"], found["chain"]),
        noise_lines(found["rows"], unit="images"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
