"""The generation benchmark's figures from its cells, the verdicts (a PASS / FAIL line for the goal,
ratio lines without one: the benchmark reports, it does not assert), the markdown table for
docs/performance-generation.md, and the results' JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scripts.bench.generation.plan import ENDPOINT, GOAL, PROG, Row, goal_rows
from scripts.bench.report import Cell
from scripts.bench.tables import calls, cell, markdown
from scripts.bench.text.report import NOISY_CORES, machine, merged, outside_cores
from scripts.bench.text.report import format_verdicts as format_goal_lines

ROLES = ("router", "triton", "nginx", "own")  # the CPU read by role (own: this process)
SETTINGS = ("seconds", "rounds", "warmup_seconds", "concurrency", "batch", "beams", "texts", "text_tokens")
SETTINGS += ("max_new_tokens", "small")  # the arguments results.json records


def _per(spent: float | None, count: float) -> float | None:
    """Milliseconds of CPU a unit (a request, a token), None when not measured."""
    return None if spent is None or not count else 1000.0 * spent / count


def figures(row: Row, rounds: Sequence[Cell], counts: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """One row's figures from its rounds and their counts (``tokens`` generated; for the endpoint,
    Triton's ``texts`` and ``executions``): calls, texts and generated tokens a second, latency, the
    batch Triton formed, and each role's CPU a request (the router's) and a generated token."""
    total = merged(rounds)
    summary = total.summary()
    seconds, calls = summary["seconds"], summary["requests"] + summary["errors"]
    tokens = [count["tokens"] for count in counts]
    generated = float(sum(tokens))
    executions = sum(count.get("executions", 0.0) for count in counts)
    endpoint = row.side == ENDPOINT
    cpu = {role: total.cpu_s.get(role) for role in ROLES}
    return {
        "key": row.key,
        "label": row.label,
        "side": row.side,
        "concurrency": row.concurrency,
        "texts_per_request": row.batch,
        "beams": row.beams,
        "requests_per_s": summary["throughput"],
        "texts_per_s": summary["throughput"] * row.batch,
        "tokens_per_s": generated / seconds if seconds else 0.0,
        "tokens_per_text": generated / (summary["requests"] * row.batch) if summary["requests"] else None,
        "p50_ms": summary["p50_ms"] if summary["requests"] else None,
        "p95_ms": summary["p95_ms"] if summary["requests"] else None,
        "texts_per_execution": sum(c.get("texts", 0.0) for c in counts) / executions if executions else None,
        "router_cpu_ms": _per(cpu["router"], calls) if endpoint else None,
        # the stack idles while generate runs: its CPU is not generate's
        **{
            f"{role}_cpu_ms_per_token": _per(spent, generated) if endpoint or role == "own" else None
            for role, spent in cpu.items()
        },
        "cores": {role: spent / seconds for role, spent in cpu.items() if spent is not None and seconds},
        "outside_cores": outside_cores(total),
        "by_round": [
            {
                "requests_per_s": cell.summary()["throughput"],
                "tokens_per_s": count / cell.seconds if cell.seconds else 0.0,
                "outside_cores": outside_cores(cell),
            }
            for cell, count in zip(rounds, tokens)
        ],
        "requests": summary["requests"],
        "errors": summary["errors"],
        "first_error": summary["first_error"],
        "seconds": seconds,
    }


def verdicts(by_key: Mapping[str, Mapping[str, Any]], concurrency: int, batch: int, beams: int) -> list[dict]:
    """The endpoint's generated tokens/s over ``generate``'s: the goal (at least ``GOAL`` x batch 1),
    and, without a goal, against batch ``batch`` and with beam search."""
    found = []
    for name, (served, local) in goal_rows(concurrency, batch, beams).items():
        value = by_key.get(served.key, {}).get("tokens_per_s")
        reference = by_key.get(local.key, {}).get("tokens_per_s")
        ratio = value / reference if value is not None and reference else None
        goal = f">= {GOAL:.2f}" if name == "goal" else ""
        found.append(
            {
                "name": f"{served.label} / {local.label}, tokens/s",
                "value": ratio,
                "goal": goal,
                "passed": ratio >= GOAL if goal and ratio is not None else None,
                "detail": f"{value:.1f} vs {reference:.1f} tokens/s" if ratio is not None else "not measured",
            }
        )
    return found


def results(rows: Sequence[Row], cells: Mapping[str, Sequence[Cell]], counts, args, start_s: float) -> dict:
    """Everything results.json holds: the machine, the command, the settings, every row, the verdicts."""
    measured = [figures(row, cells[row.key], counts[row.key]) for row in rows]
    settings = {name: getattr(args, name) for name in SETTINGS}
    settings.update(min_new_tokens=args.max_new_tokens, repository=str(args.repository), env=dict(args.env))
    return {
        "machine": machine(),
        "command": " ".join([PROG, *args.argv]),
        "settings": settings,
        "start_to_ping_s": start_s,
        "rows": measured,
        "verdicts": verdicts({row["key"]: row for row in measured}, args.concurrency, args.batch, args.beams),
    }


# The table's columns: (header, the cell of a row), the numbers right-aligned.
COLUMNS = (
    ("row", lambda row: row["label"]),
    ("texts/call", lambda row: str(row["texts_per_request"])),
    ("req/s", lambda row: cell(row["requests_per_s"])),
    ("texts/s", lambda row: cell(row["texts_per_s"])),
    ("tokens/s", lambda row: cell(row["tokens_per_s"])),
    ("p50 ms", lambda row: cell(row["p50_ms"])),
    ("Triton texts/execution", lambda row: cell(row["texts_per_execution"])),
    ("router CPU ms/request", lambda row: cell(row["router_cpu_ms"], 2)),
    ("Triton CPU ms/token", lambda row: cell(row["triton_cpu_ms_per_token"], 2)),
    ("this process CPU ms/token", lambda row: cell(row["own_cpu_ms_per_token"], 2)),
    ("calls", calls),
)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as the markdown table of docs/performance-generation.md's "Text2text generation"."""
    return markdown(COLUMNS, rows)


def format_verdicts(found: Sequence[Mapping[str, Any]]) -> str:
    """The goal's PASS / FAIL line (as the text benchmark prints them), then the ratios without a goal."""
    lines = [format_goal_lines([verdict]) if verdict["goal"] else "" for verdict in found]
    for i, verdict in enumerate(found):
        if not verdict["goal"]:
            shown = "—" if verdict["value"] is None else f"{verdict['value']:.2f}"
            lines[i] = f"info {verdict['name']}: {shown} ({verdict['detail']}; no goal)"
    return "\n".join(lines)


def progress_label(r: int, rounds: int, row: Row, cell: Cell, tokens: float) -> str:
    """What a step's progress line says besides calls/s and p50 (``scripts.bench.load.Progress``):
    the round, the row, its generated tokens/s, the router's CPU a request, the machine's noise."""
    summary = cell.summary()
    shown = [f"{tokens / cell.seconds if cell.seconds else 0.0:.0f} tokens/s"]
    router = _per(cell.cpu_s.get("router"), summary["requests"] + summary["errors"])
    if router is not None and row.side == ENDPOINT:
        shown.append(f"router {router:.2f} ms/req")
    outside = outside_cores(cell)
    if outside is not None and outside > NOISY_CORES:
        shown.append(f"outside CPU {outside:.2f} cores")
    if summary["errors"]:
        shown.append(f"first error: {summary['first_error'][:120]}")
    return f"round {r + 1}/{rounds} {row.key} ({', '.join(shown)})"
