"""The generation benchmark's figures from its cells, the verdicts (a PASS / FAIL line for the goal,
ratio lines without one: the benchmark reports, it does not assert), the markdown table for
docs/performance.md, and the results' JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scripts.bench.generation.plan import ENDPOINT, GOAL, MODEL, Row, goal_rows
from scripts.bench.report import Cell
from scripts.bench.text.report import NOISY_CORES, machine, merged, outside_cores
from scripts.bench.text.report import format_verdicts as format_goal_lines

ROLES = ("router", "triton", "nginx", "own")  # the CPU read by role (own: this process)


def _per(spent: float | None, count: float) -> float | None:
    """Milliseconds of CPU a unit (a request, a token), None when not measured."""
    return None if spent is None or not count else 1000.0 * spent / count


def figures(row: Row, rounds: Sequence[Cell], tokens: Sequence[float]) -> dict[str, Any]:
    """One row's figures from its rounds: calls, texts and generated tokens a second, latency, and
    each role's CPU a request (the router's, as the text benchmark reports it) and a generated token."""
    total = merged(rounds)
    summary = total.summary()
    seconds, calls = summary["seconds"], summary["requests"] + summary["errors"]
    generated = float(sum(tokens))
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
        "router_cpu_ms": _per(cpu["router"], calls) if endpoint else None,
        **{f"{role}_cpu_ms_per_token": _per(spent, generated) for role, spent in cpu.items()},
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


def results(rows: Sequence[Row], cells: Mapping[str, Sequence[Cell]], tokens, args, start_s: float) -> dict:
    """Everything results.json holds: the machine, the command, the settings, every row, the verdicts."""
    measured = [figures(row, cells[row.key], tokens[row.key]) for row in rows]
    settings = ("seconds", "rounds", "warmup_seconds", "concurrency", "batch", "beams", "texts", "text_tokens")
    return {
        "machine": machine(),
        "command": " ".join(["python -m scripts.bench.generation", *args.argv]),
        "settings": {
            **{name: getattr(args, name) for name in settings},
            "max_new_tokens": args.max_new_tokens,
            "min_new_tokens": args.max_new_tokens,
            "small": args.small,
            "repository": str(args.repository),
            "env": dict(args.env),
        },
        "start_to_ping_s": start_s,
        "rows": measured,
        "verdicts": verdicts({row["key"]: row for row in measured}, args.concurrency, args.batch, args.beams),
    }


def _cell(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as the markdown table of docs/performance.md's "Text2text generation"."""
    columns = (
        "row | texts/call | req/s | texts/s | tokens/s | p50 ms | router CPU ms/request "
        "| Triton CPU ms/token | this process CPU ms/token | calls"
    )
    lines = [f"| {columns} |", "| --- |" + " ---: |" * 9]
    for row in rows:
        count = f"{row['requests']}" + (f" ({row['errors']} errors)" if row["errors"] else "")
        lines.append(
            f"| {row['label']} | {row['texts_per_request']} | {_cell(row['requests_per_s'])} "
            f"| {_cell(row['texts_per_s'])} | {_cell(row['tokens_per_s'])} | {_cell(row['p50_ms'])} "
            f"| {_cell(row['router_cpu_ms'], 2)} | {_cell(row['triton_cpu_ms_per_token'], 2)} "
            f"| {_cell(row['own_cpu_ms_per_token'], 2)} | {count} |"
        )
    return "\n".join(lines)


def format_verdicts(found: Sequence[Mapping[str, Any]]) -> str:
    """The goal's PASS / FAIL line (as the text benchmark prints them), then the ratios without a goal."""
    lines = [format_goal_lines([verdict]) if verdict["goal"] else "" for verdict in found]
    for i, verdict in enumerate(found):
        if not verdict["goal"]:
            shown = "—" if verdict["value"] is None else f"{verdict['value']:.2f}"
            lines[i] = f"info {verdict['name']}: {shown} ({verdict['detail']}; no goal)"
    return "\n".join(lines)


def progress(row: Row, cell: Cell, tokens: float) -> str:
    """One step's line: calls/s, generated tokens/s, p50, the router's CPU a request, the machine's noise."""
    summary = cell.summary()
    router = _per(cell.cpu_s.get("router"), summary["requests"] + summary["errors"])
    shown = f", router {router:.2f} ms/req" if router is not None and row.side == ENDPOINT else ""
    outside = outside_cores(cell)
    noisy = f", outside CPU {outside:.2f} cores" if outside is not None and outside > NOISY_CORES else ""
    errors = f", {summary['errors']} errors ({summary['first_error'][:120]})" if summary["errors"] else ""
    return (
        f"{row.key}: {summary['throughput']:.2f} calls/s, {tokens / cell.seconds if cell.seconds else 0:.0f} "
        f"tokens/s ({MODEL}), p50 {summary['p50_ms']:.0f} ms{shown}{noisy}{errors}"
    )
