"""The text benchmark's figures from its cells, the goals' verdicts (PASS / FAIL lines: the benchmark
reports, it does not assert), the markdown table for docs/performance-text.md, and the results' JSON."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.bench.report import Cell
from scripts.bench.text.plan import (
    BATCH_GOAL,
    BATCH_SIDE,
    BATCH_TEXTS,
    CPU_MARGIN_MS,
    ENCODE,
    ENCODE_SIDE,
    FILL_MASK,
    MODELS,
    NEW_FAMILIES,
    SENTENCE_EMBEDDING,
    SINGLE_GOAL,
    SINGLE_SIDE,
    Row,
)

NOISE_SPREAD = 0.25  # rounds of a row further apart than this get a noise line
NOISY_CORES = 0.1  # CPU outside the benchmark, in CPUs, above which a step's line says so


def _number(value: Any) -> float | None:
    """A figure for JSON: None for a missing or NaN value."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def label(row: Row) -> str:
    """The row's name in the table."""
    if row.side == BATCH_SIDE:
        return f"{row.family}, {row.length}: {row.texts} texts a request"
    if row.side == SINGLE_SIDE:
        return f"{row.family}, {row.length}: one text a request, c={row.concurrency}"
    if row.side == ENCODE_SIDE:
        return f"{row.family}, {row.length}: SentenceTransformer.encode(batch_size={BATCH_TEXTS}), one process"
    return f"{row.family}, {row.length}"


def merged(rounds: Sequence[Cell]) -> Cell:
    """A row's rounds as one Cell: requests, time and CPU added up."""
    total = Cell()
    for cell in rounds:
        total.add(cell.latencies_s, cell.errors, cell.seconds, cell.work, cell.first_error, cell.cpu_s)
    return total


def outside_cores(cell: Cell) -> float | None:
    """CPUs' worth of work neither the stack's measured processes nor this process did during the
    cell (other programs, the hypervisor's steal; a few hundredths are ``serve``'s own and
    gunicorn's master): above a tenth, the machine's noise reached the figures."""
    cpu = cell.cpu_s
    if "machine" not in cpu or cell.seconds <= 0:
        return None
    ours = sum(cpu.get(role, 0.0) for role in ("router", "triton", "nginx", "own"))
    return (cpu["machine"] - ours + cpu.get("steal", 0.0)) / cell.seconds


def figures(row: Row, rounds: Sequence[Cell], tokens: float) -> dict[str, Any]:
    """One row's figures from its rounds' Cells. Per request: the router's (gunicorn workers'), Triton's,
    NGINX's and the clients' CPU; per text: the network's CPU (Triton's, or encode()'s in this process)."""
    total = merged(rounds)
    summary = total.summary()
    requests = _number(summary.get("throughput")) or 0.0
    own = _number(summary.get("own_cpu_ms"))
    network = own if row.kind == ENCODE else _number(summary.get("triton_cpu_ms"))
    return {
        "key": row.key,
        "label": label(row),
        "family": row.family,
        "model": MODELS[row.family],
        "length": row.length,
        "side": row.side,
        "tokens_per_text": round(tokens, 1),
        "texts_per_request": row.texts,
        "concurrency": row.concurrency,
        "requests_per_s": requests,
        "texts_per_s": requests * row.texts,
        "p50_ms": _number(summary.get("p50_ms")),
        "p95_ms": _number(summary.get("p95_ms")),
        "router_cpu_ms": None if row.kind == ENCODE else _number(summary.get("router_cpu_ms")),
        "triton_cpu_ms": None if row.kind == ENCODE else _number(summary.get("triton_cpu_ms")),
        "nginx_cpu_ms": None if row.kind == ENCODE else _number(summary.get("nginx_cpu_ms")),
        "client_cpu_ms": None if row.kind == ENCODE else own,
        "network_cpu_ms_per_text": None if network is None else network / row.texts,
        "outside_cores": outside_cores(total),
        "by_round": [
            {
                "requests_per_s": cell.summary()["throughput"],
                "router_cpu_ms": None if row.kind == ENCODE else _number(cell.summary().get("router_cpu_ms")),
                "outside_cores": outside_cores(cell),
            }
            for cell in rounds
        ],
        "requests": summary.get("requests", 0),
        "errors": summary.get("errors", 0),
        "first_error": summary.get("first_error", ""),
        "seconds": summary.get("seconds", 0.0),
    }


def _verdict(name: str, value: float | None, goal: str, passed: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "value": value, "goal": goal, "passed": passed, "detail": detail}


def round_differences(row: Mapping[str, Any], reference: Mapping[str, Any]) -> list[float]:
    """The row's router CPU per request less the reference's, round by round (the rows' rounds are
    measured in the same interleaved rounds): how far apart the rounds are, next to the pooled figure."""
    pairs = zip(row.get("by_round", []), reference.get("by_round", []))
    found = [(ours.get("router_cpu_ms"), theirs.get("router_cpu_ms")) for ours, theirs in pairs]
    return [a - b for a, b in found if a is not None and b is not None]


def cpu_verdicts(by_key: Mapping[str, Mapping[str, Any]], lengths: Sequence[str], margin: float = CPU_MARGIN_MS):
    """Each new family's router CPU per request against bert_base's fill-mask at the same length; with
    several rounds, the detail gives each round's difference too."""
    found = []
    for length in lengths:
        reference_row = by_key.get(f"{FILL_MASK}/{length}", {})
        reference = reference_row.get("router_cpu_ms")
        for family in NEW_FAMILIES:
            row = by_key.get(f"{family}/{length}", {})
            value = row.get("router_cpu_ms")
            measured = value is not None and reference is not None
            difference = value - reference if measured else None
            detail = f"{value:.2f} vs {reference:.2f} ms" if measured else "not measured"
            rounds = round_differences(row, reference_row) if measured else []
            if len(rounds) > 1:
                detail += f"; by round {', '.join(f'{d:+.2f}' for d in rounds)}"
            found.append(
                _verdict(
                    f"router CPU/request, {family} {length} - fill_mask {length}",
                    difference,
                    f"<= +{margin:.2f} ms",
                    difference <= margin if measured else None,
                    detail,
                )
            )
    return found


def embedding_verdicts(by_key: Mapping[str, Mapping[str, Any]], lengths: Sequence[str]):
    """The embeddings through the public port against encode() in one process, in texts/s."""
    found = []
    for length in lengths:
        base = f"{SENTENCE_EMBEDDING}/{length}"
        encode = by_key.get(f"{base}/{ENCODE_SIDE}", {}).get("texts_per_s")
        for side, goal, what in (
            (BATCH_SIDE, BATCH_GOAL, f"requests of {BATCH_TEXTS} texts"),
            (SINGLE_SIDE, SINGLE_GOAL, "single-text requests"),
        ):
            row = by_key.get(f"{base}/{side}", {})
            value = row.get("texts_per_s")
            ratio = value / encode if value is not None and encode else None
            where = f", c={row['concurrency']}" if "concurrency" in row else ""
            found.append(
                _verdict(
                    f"embeddings {length}: {what}{where} / encode(batch_size={BATCH_TEXTS}), texts/s",
                    ratio,
                    f">= {goal:.2f}",
                    ratio >= goal if ratio is not None else None,
                    f"{value:.1f} vs {encode:.1f} texts/s" if ratio is not None else "not measured",
                )
            )
    return found


def machine() -> dict[str, Any]:
    """The machine the figures come from: CPUs this process may use, the CPU's model, the Python."""
    model = ""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    except OSError:
        pass
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": model, "python": platform.python_version()}


def results(
    rows: Sequence[Row],
    cells: Mapping[str, Sequence[Cell]],
    tokens: Mapping[tuple[str, str], float],
    args,
    start_s: float,
) -> dict[str, Any]:
    """Everything results.json holds: the machine, the command, the settings, every row, the verdicts."""
    measured = [figures(row, cells[row.key], tokens[row.family, row.length]) for row in rows]
    by_key = {figure["key"]: figure for figure in measured}
    return {
        "machine": machine(),
        "command": " ".join(["python -m scripts.bench.text", *args.argv]),
        "settings": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "single_concurrency": args.single_concurrency,
            "lengths": list(args.lengths),
            "small": args.small,
            "repository": str(args.repository),
            "env": dict(args.env),
        },
        "start_to_ping_s": start_s,
        "rows": measured,
        "verdicts": cpu_verdicts(by_key, args.lengths) + embedding_verdicts(by_key, args.lengths),
    }


def _cell(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as the markdown table of docs/performance-text.md."""
    columns = "row | model | tokens/text | c | req/s | texts/s | p50 ms | router CPU ms/request | network CPU ms/text"
    lines = [f"| {columns} | requests |", "| --- | --- |" + " ---: |" * 8]
    for row in rows:
        count = f"{row['requests']}" + (f" ({row['errors']} errors)" if row["errors"] else "")
        lines.append(
            f"| {row['label']} | {row['model'] if row['side'] != ENCODE_SIDE else 'all-MiniLM-L6-v2 (torch)'} "
            f"| {row['tokens_per_text']:g} | {row['concurrency']} | {_cell(row['requests_per_s'])} "
            f"| {_cell(row['texts_per_s'])} | {_cell(row['p50_ms'])} | {_cell(row['router_cpu_ms'], 2)} "
            f"| {_cell(row['network_cpu_ms_per_text'], 2)} | {count} |"
        )
    return "\n".join(lines)


def format_verdicts(verdicts: Sequence[Mapping[str, Any]]) -> str:
    """One line per goal: PASS, FAIL or "n/a" (not measured), the value, what it came from, the goal."""
    lines = []
    for verdict in verdicts:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[verdict["passed"]]
        value = verdict["value"]
        shown = "—" if value is None else f"{value:+.2f} ms" if "ms" in verdict["goal"] else f"{value:.2f}"
        lines.append(f"{mark} {verdict['name']}: {shown} ({verdict['detail']}; goal {verdict['goal']})")
    return "\n".join(lines)


def noise_lines(rows: Sequence[Mapping[str, Any]], spread: float = NOISE_SPREAD, unit: str = "texts") -> str:
    """A line for each row whose rounds disagree by more than ``spread``, with the CPU the machine
    spent outside the benchmark in each: what to distrust, and whether the machine says why."""
    lines = []
    for row in rows:
        rates = [r["requests_per_s"] for r in row["by_round"]]
        if len(rates) < 2 or (min(rates) > 0 and max(rates) / min(rates) <= 1 + spread):
            continue
        outside = ", ".join(_cell(r["outside_cores"], 2) for r in row["by_round"])
        shown = ", ".join(f"{rate * row['texts_per_request']:.1f}" for rate in rates)
        lines.append(f"noise: {row['key']}: {shown} {unit}/s by round (outside CPU {outside} cores)")
    return "\n".join(lines)


def progress_line(row: Row, cell: Cell) -> str:
    """One step's line: throughput, texts/s, p50, the router's CPU per request, the machine's noise."""
    summary = cell.summary()
    throughput, unit = summary["throughput"], "calls/s" if row.kind == ENCODE else "req/s"
    cpu = summary.get("router_cpu_ms") if row.kind != ENCODE else None
    router = f", router {cpu:.2f} ms/req" if cpu is not None else ""
    outside = outside_cores(cell)
    noisy = f", outside CPU {outside:.2f} cores" if outside is not None and outside > NOISY_CORES else ""
    errors = f", {summary['errors']} errors ({summary['first_error'][:120]})" if summary["errors"] else ""
    return (
        f"{row.key} c={row.concurrency}: {throughput:.1f} {unit}, {throughput * row.texts:.1f} texts/s, "
        f"p50 {summary['p50_ms']:.1f} ms{router}{noisy}{errors}"
    )
