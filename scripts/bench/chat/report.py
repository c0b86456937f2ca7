"""The chat benchmark's figures from its cells, the verdicts (PASS / FAIL for the two goals, ratio
and check lines without one: the benchmark reports, it does not assert), the markdown table for
docs/performance-generation.md, and the results' JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scripts.bench.chat.plan import (
    ENDPOINT,
    GENAI,
    GENERATE,
    GOAL_CONSTRAINED,
    GOAL_PEER,
    GOAL_TOKENS,
    GOAL_TTFT,
    LOCAL,
    PEERS,
    PROBES,
    PROG,
    Row,
    goal_rows,
    peer_rows,
)
from scripts.bench.report import Cell
from scripts.bench.tables import calls, cell, markdown
from scripts.bench.text.report import NOISY_CORES, machine, merged, outside_cores
from scripts.bench.text.report import format_verdicts as format_goal_lines
from scripts.devtools import percentile

ROLES = ("router", "triton", "nginx", "own")  # the CPU read by role (own: this process)
SETTINGS = ("seconds", "rounds", "warmup_seconds", "concurrency", "texts", "text_tokens", "max_new_tokens")
SETTINGS += (
    "short_new_tokens",
    "long_new_tokens",
    "long_new",
    "generate_threads",
    "small",
    "shape",
    "engine",
    "weights",
    "precision",
)  # the arguments results.json records


def _ms(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile of seconds, in milliseconds; None for no values."""
    return 1000.0 * percentile(values, q) if values else None


def _per(spent: float | None, count: float) -> float | None:
    """Milliseconds of CPU a generated token, None when not measured."""
    return None if spent is None or not count else 1000.0 * spent / count


def label(row: Row, args) -> str:
    return row.label(args.max_new_tokens, args.short_new_tokens, args.long_new)


def figures(row: Row, rounds: Sequence[Cell], counts: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """One row's figures from its rounds and what their calls made (``tokens``; streamed: ``ttft_s``,
    ``gaps_s``): calls and generated tokens a second, a call's latency, the time to the first token
    and between tokens at p50 / p99, and each role's CPU a generated token (not for the short request's
    rows, whose tokens are few beside the long generations')."""
    total = merged(rounds)
    summary = total.summary()
    seconds, calls = summary["seconds"], summary["requests"]
    generated = float(sum(count["tokens"] for count in counts))
    ttft = [t for count in counts for t in count.get("ttft_s", ())]
    gaps = [g for count in counts for g in count.get("gaps_s", ())]
    probe = row.side in PROBES
    cpu = {role: total.cpu_s.get(role) for role in ROLES}
    return {
        "key": row.key,
        "label": name,
        "side": row.side,
        "concurrency": row.concurrency,
        "texts_per_request": 1,
        "requests_per_s": summary["throughput"],
        "tokens_per_s": None if probe else generated / seconds if seconds else 0.0,
        "tokens_per_call": generated / calls if calls else None,
        "p50_ms": summary["p50_ms"] if calls else None,
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "itl_p50_ms": _ms(gaps, 50),
        "itl_p99_ms": _ms(gaps, 99),
        "first_tokens": len(ttft),
        # the stack idles while generate or the peer runs: its CPU is not theirs
        **{
            f"{role}_cpu_ms_per_token": None
            if probe or (row.side in (*LOCAL, *PEERS) and role != "own")
            else _per(spent, generated)
            for role, spent in cpu.items()
        },
        "cores": {role: spent / seconds for role, spent in cpu.items() if spent is not None and seconds},
        "outside_cores": outside_cores(total),
        "by_round": [
            {
                "requests_per_s": cell.summary()["throughput"],
                "tokens_per_s": count["tokens"] / cell.seconds if cell.seconds else 0.0,
                "ttft_p50_ms": _ms(count.get("ttft_s", ()), 50),
                "outside_cores": outside_cores(cell),
            }
            for cell, count in zip(rounds, counts)
        ],
        "requests": calls,
        "errors": summary["errors"],
        "first_error": summary["first_error"],
        "seconds": seconds,
    }


def _verdict(name: str, value: float | None, goal: str, passed: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "value": value, "goal": goal, "passed": passed, "detail": detail}


def verdicts(by_key: Mapping[str, Mapping[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    """The endpoint at ``concurrency`` against ``generate``'s tokens/s (at least ``GOAL_TOKENS`` x), the
    short request's time to first token beside the long generations against alone (p50, at most
    ``GOAL_TTFT`` x), answers to a JSON Schema and chat answers that must call a tool against the
    same calls unconstrained (at least ``GOAL_CONSTRAINED`` x, where measured), and, without a goal, the endpoint at concurrency 1 against
    ``generate``."""
    pairs = goal_rows(concurrency)
    served, local = (by_key.get(row.key, {}) for row in pairs["tokens"])
    name = f"{served.get('label', pairs['tokens'][0].key)} / {local.get('label', GENERATE)}, tokens/s"
    found = [_tokens_verdict(name, served, local, GOAL_TOKENS)]
    loaded, alone = (by_key.get(row.key, {}) for row in pairs["ttft"])
    value, reference = loaded.get("ttft_p50_ms"), alone.get("ttft_p50_ms")
    ratio = value / reference if value is not None and reference else None
    p99 = loaded.get("ttft_p99_ms"), alone.get("ttft_p99_ms")
    detail = f"p50 {value:.1f} vs {reference:.1f} ms" if ratio is not None else "not measured"
    if ratio is not None and None not in p99:
        detail += f"; p99 {p99[0]:.1f} vs {p99[1]:.1f} ms"
    found.append(
        _verdict(
            f"time to first token, {loaded.get('label', pairs['ttft'][0].key)} / alone",
            ratio,
            f"<= {GOAL_TTFT:.2f}",
            None if ratio is None else ratio <= GOAL_TTFT,
            detail,
        )
    )
    for kind in ("constrained", "tools"):  # the onnxruntime engine: grammars against the same prompts free
        constrained, free = (by_key.get(row.key) for row in pairs[kind])
        if constrained is not None:
            reference = (free or {}).get("label", "unconstrained")
            name = f"{constrained.get('label', pairs[kind][0].key)} / {reference}, tokens/s"
            found.append(_tokens_verdict(name, constrained, free or {}, GOAL_CONSTRAINED))
    infos = [(Row(ENDPOINT, 1).key, GENERATE)]
    infos += [(Row(ENDPOINT, c).key, Row(GENAI, c).key) for c in dict.fromkeys((1, concurrency))]
    for served_key, local_key in infos:
        if local_key not in by_key and local_key != GENERATE:
            continue  # no GenAI row: not the openvino engine
        single, local = by_key.get(served_key, {}), by_key.get(local_key, {})
        name = f"{single.get('label', served_key)} / {local.get('label', local_key)}, tokens/s"
        found.append(_tokens_verdict(name, single, local, None))
    return found + peer_verdicts(by_key, concurrency)


def _tokens_verdict(
    name: str, served: Mapping[str, Any], reference: Mapping[str, Any], goal: float | None
) -> dict[str, Any]:
    """``served``'s tokens/s against ``reference``'s: at least ``goal`` x (None: no goal, a figure)."""
    value, base = served.get("tokens_per_s"), reference.get("tokens_per_s")
    ratio = value / base if value is not None and base else None
    passed = None if ratio is None or goal is None else ratio >= goal
    detail = f"{value:.1f} vs {base:.1f} tokens/s" if ratio is not None else "not measured"
    return _verdict(name, ratio, f">= {goal:.2f}" if goal is not None else "", passed, detail)


def peer_verdicts(by_key: Mapping[str, Mapping[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    """The endpoint against llama.cpp's server where it ran: tokens/s with 1 and ``concurrency`` callers
    at least ``GOAL_PEER`` x, the first token's wait (p50) streamed at ``concurrency`` and on a
    conversation's next turn at most ``GOAL_PEER`` x."""
    found = []
    for figure, ours, theirs in peer_rows(concurrency):
        if theirs.key not in by_key:
            continue
        served, peer = by_key.get(ours.key, {}), by_key[theirs.key]
        value, reference = served.get(figure), peer.get(figure)
        ratio = value / reference if value is not None and reference else None
        faster = figure == "tokens_per_s"
        unit = "tokens/s" if faster else "ms, first token p50"
        found.append(
            _verdict(
                f"{served.get('label', ours.key)} / {peer.get('label', theirs.key)}, {unit}",
                ratio,
                f"{'>=' if faster else '<='} {GOAL_PEER:.2f}",
                None if ratio is None else (ratio >= GOAL_PEER if faster else ratio <= GOAL_PEER),
                f"{value:.1f} vs {reference:.1f} {unit.split(',')[0]}" if ratio is not None else "not measured",
            )
        )
    return found


def results(rows: Sequence[Row], cells: Mapping[str, Sequence[Cell]], counts, args, start_s: float) -> dict:
    """Everything results.json holds: the machine, the command, the settings, every row, the verdicts."""
    measured = [figures(row, cells[row.key], counts[row.key], label(row, args)) for row in rows]
    settings = {name: getattr(args, name) for name in SETTINGS}
    settings.update(repository=str(args.repository), env=dict(args.env))
    return {
        "machine": machine(),
        "command": " ".join([PROG, *args.argv]),
        "settings": settings,
        "start_to_ping_s": start_s,
        "rows": measured,
        "verdicts": verdicts({row["key"]: row for row in measured}, args.concurrency),
    }


# The table's columns: (header, the cell of a row), the numbers right-aligned.
COLUMNS = (
    ("row", lambda row: row["label"]),
    ("tokens/s", lambda row: cell(row["tokens_per_s"])),
    ("tokens/call", lambda row: cell(row["tokens_per_call"])),
    ("p50 ms", lambda row: cell(row["p50_ms"])),
    ("TTFT p50 ms", lambda row: cell(row["ttft_p50_ms"])),
    ("TTFT p99 ms", lambda row: cell(row["ttft_p99_ms"])),
    ("ITL p50 ms", lambda row: cell(row["itl_p50_ms"])),
    ("ITL p99 ms", lambda row: cell(row["itl_p99_ms"])),
    ("router CPU ms/token", lambda row: cell(row["router_cpu_ms_per_token"], 2)),
    ("Triton CPU ms/token", lambda row: cell(row["triton_cpu_ms_per_token"], 2)),
    ("this process CPU ms/token", lambda row: cell(row["own_cpu_ms_per_token"], 2)),
    ("calls", calls),
)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as the markdown table of docs/performance-generation.md's "Text generation"."""
    return markdown(COLUMNS, rows)


def format_verdicts(found: Sequence[Mapping[str, Any]], checks: Mapping[str, Any]) -> str:
    """The goals' PASS / FAIL lines, the ratios without a goal, then the checks of the first answer."""
    lines = []
    for verdict in found:
        if verdict["goal"]:
            lines.append(format_goal_lines([verdict]))
            continue
        shown = "—" if verdict["value"] is None else f"{verdict['value']:.2f}"
        lines.append(f"info {verdict['name']}: {shown} ({verdict['detail']}; no goal)")
    lines.append(
        f"info the endpoint's greedy text for the first prompt is generate's: {checks['same_as_generate']}; "
        f"streamed, generate's tokens: {checks['stream_tokens_same_as_generate']}, "
        f"the whole answer's text: {checks['stream_same_as_whole']}; "
        f"tokens (generate, whole, streamed): {', '.join(map(str, checks['tokens_of_the_first_answer']))}"
    )
    if "llama_cpp" in checks:
        peer = checks["llama_cpp"]
        lines.append(
            f"info llama.cpp: {peer['server']} on {peer['gguf']}; its greedy tokens for the first prompt are "
            f"generate's: {peer['same_as_generate']} ({peer['tokens']} tokens)"
        )
    return "\n".join(lines)


def progress_label(r: int, rounds: int, row: Row, cell: Cell, made: Mapping[str, Any]) -> str:
    """What a step's progress line says besides calls/s and p50 (``scripts.bench.load.Progress``): the
    round, the row, its generated tokens/s or its time to first token, the machine's noise."""
    summary = cell.summary()
    shown = []
    if row.side not in PROBES:
        shown.append(f"{made['tokens'] / cell.seconds if cell.seconds else 0.0:.0f} tokens/s")
    if made.get("ttft_s"):
        shown.append(f"TTFT p50 {_ms(made['ttft_s'], 50):.1f} ms")
    outside = outside_cores(cell)
    if outside is not None and outside > NOISY_CORES:
        shown.append(f"outside CPU {outside:.2f} cores")
    if summary["errors"]:
        shown.append(f"first error: {summary['first_error'][:120]}")
    return f"round {r + 1}/{rounds} {row.key} ({', '.join(shown)})"
