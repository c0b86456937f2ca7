"""The prompted benchmark's figures from its cells, the verdicts (PASS / FAIL a goal: the benchmark
reports, it does not assert), the markdown table for docs/performance-prompted.md, and the results' JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scripts.bench.prompted.plan import BOXES_GOAL, GOAL_BOXES, GOAL_SPEED, PROG, REFERENCE, Row, goal_rows
from scripts.bench.report import Cell
from scripts.bench.tables import calls, cell, markdown
from scripts.bench.text.report import NOISY_CORES, machine, merged, outside_cores
from scripts.bench.text.report import format_verdicts as format_goal_lines

ROLES = ("router", "triton", "nginx", "own")  # the CPU read by role (own: this process)
SETTINGS = ("families", "images", "rounds", "warmup", "concurrency", "reference_threads", "small")


def figures(row: Row, rounds: Sequence[Cell], name: str) -> dict[str, Any]:
    """One row's figures from its rounds: images/s (the calls over the steps' wall time), a call's p50,
    the CPU by role in cores (the stack idles while a reference runs), the machine's noise."""
    total = merged(rounds)
    summary = total.summary()
    seconds = summary["seconds"]
    return {
        "key": row.key,
        "label": name,
        "family": row.family,
        "side": row.side,
        "boxes": row.boxes,
        "concurrency": row.concurrency,
        "texts_per_request": 1,  # the noise lines' unit: one image a request
        "images_per_s": summary["throughput"],
        "p50_ms": summary["p50_ms"] if summary["requests"] else None,
        "cores": {role: total.cpu_s[role] / seconds for role in ROLES if role in total.cpu_s and seconds},
        "outside_cores": outside_cores(total),
        "by_round": [
            {"requests_per_s": one.summary()["throughput"], "outside_cores": outside_cores(one)} for one in rounds
        ],
        "requests": summary["requests"],
        "errors": summary["errors"],
        "first_error": summary["first_error"],
        "seconds": seconds,
    }


def _verdict(name: str, value: float | None, goal: str, passed: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "value": value, "goal": goal, "passed": passed, "detail": detail}


def verdicts(by_key: Mapping[str, Mapping[str, Any]], families: Sequence[str], concurrency: int) -> list[dict]:
    """Each family's endpoint against its reference, images/s (at least ``GOAL_SPEED`` x); SAM's (SAM-HQ's)
    time a request with 8 boxes against 1 at the same concurrency (1 / images/s, at most ``GOAL_BOXES`` x)."""
    found = []
    for name, (measured, reference) in goal_rows(families, concurrency).items():
        served, local = by_key.get(measured.key, {}), by_key.get(reference.key, {})
        value, base = served.get("images_per_s"), local.get("images_per_s")
        if name.endswith(BOXES_GOAL):  # time a request: the inverse of images/s
            ratio = base / value if value and base else None
            found.append(
                _verdict(
                    f"{measured.key} / {reference.key}, time a request (1 / images/s)",
                    ratio,
                    f"<= {GOAL_BOXES:.2f}",
                    None if ratio is None else ratio <= GOAL_BOXES,
                    f"{1000 / value:.0f} vs {1000 / base:.0f} ms an image; p50 {served['p50_ms']:.0f} vs "
                    f"{local['p50_ms']:.0f} ms a call"
                    if ratio is not None
                    else "not measured",
                )
            )
            continue
        ratio = value / base if value is not None and base else None
        found.append(
            _verdict(
                f"{measured.key} / {reference.key}, images/s",
                ratio,
                f">= {GOAL_SPEED:.2f}",
                None if ratio is None else ratio >= GOAL_SPEED,
                f"{value:.3f} vs {base:.3f} images/s" if ratio is not None else "not measured",
            )
        )
    return found


def results(rows: Sequence[Row], cells: Mapping[str, Sequence[Cell]], models, args, start_s: float) -> dict:
    """Everything results.json holds: the machine, the command, the settings, every row, the verdicts."""
    measured = [figures(row, cells[row.key], row.label(models)) for row in rows]
    settings = {name: getattr(args, name) for name in SETTINGS}
    settings.update(repository=str(args.repository), env=dict(args.env), models=dict(models))
    families = sorted({row.family for row in rows}, key=[row.family for row in rows].index)
    return {
        "machine": machine(),
        "command": " ".join([PROG, *args.argv]),
        "settings": settings,
        "start_to_ping_s": start_s,
        "rows": measured,
        "verdicts": verdicts({row["key"]: row for row in measured}, families, args.concurrency),
    }


# The table's columns: (header, the cell of a row), the numbers right-aligned.
COLUMNS = (
    ("row", lambda row: row["label"]),
    ("images/s", lambda row: cell(row["images_per_s"], 3)),
    ("p50 ms", lambda row: cell(row["p50_ms"], 0)),
    ("router cores", lambda row: cell(None if row["side"] == REFERENCE else row["cores"].get("router"), 2)),
    ("Triton cores", lambda row: cell(None if row["side"] == REFERENCE else row["cores"].get("triton"), 2)),
    ("this process cores", lambda row: cell(row["cores"].get("own"), 2)),
    ("calls", calls),
)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as the markdown table of docs/performance-prompted.md."""
    return markdown(COLUMNS, rows)


def format_verdicts(found: Sequence[Mapping[str, Any]], chain: str) -> str:
    """The goals' PASS / FAIL lines, then why the chain was skipped (where it was)."""
    return "\n".join(filter(None, [format_goal_lines(found), chain]))


def progress_label(r: int, rounds: int, row: Row, one: Cell) -> str:
    """What a step's progress line says besides calls/s and p50: the round, the row, the machine's noise."""
    shown = [f"{one.summary()['throughput']:.3f} images/s"]
    outside = outside_cores(one)
    if outside is not None and outside > NOISY_CORES:
        shown.append(f"outside CPU {outside:.2f} cores")
    if one.errors:
        shown.append(f"first error: {one.first_error[:120]}")
    return f"round {r + 1}/{rounds} {row.key} ({', '.join(shown)})"
