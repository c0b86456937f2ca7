"""The pure parts: per-cell statistics, the interleaving schedule, the targets table, and the plots."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench.constants import IDENTITY, MODELS, PYSTEP_SIDE, ROUTER_SIDE, TRITON_SIDE
from scripts.devtools import percentile
from scripts.terminal import text_table


@dataclass
class Cell:
    """Everything measured for one (model, side, concurrency), over all rounds."""

    latencies_s: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    seconds: float = 0.0  # the measured windows, added up
    work: float = 0.0  # requests done within those windows
    first_error: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds by process role (placement sides)

    def add(
        self,
        latencies_s: Sequence[float],
        errors: int,
        seconds: float,
        work: float,
        first_error: str = "",
        cpu_s: Mapping[str, float] | None = None,
    ) -> None:
        for role, spent in (cpu_s or {}).items():
            self.cpu_s[role] = self.cpu_s.get(role, 0.0) + spent
        self.latencies_s.extend(latencies_s)
        self.ok += len(latencies_s)
        self.errors += errors
        self.seconds += seconds
        self.work += work
        self.first_error = self.first_error or first_error

    def summary(self) -> dict[str, Any]:
        ms = [s * 1000.0 for s in self.latencies_s]
        return {
            "throughput": self.work / self.seconds if self.seconds > 0 else 0.0,
            "p50_ms": percentile(ms, 50),
            "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99),
            "requests": self.ok,
            "errors": self.errors,
            "seconds": self.seconds,
            "first_error": self.first_error,
            # CPU per request of each of the stack's processes: router (gunicorn workers), triton, nginx
            **{
                f"{role}_cpu_ms": 1000.0 * spent / (self.ok + self.errors)
                for role, spent in self.cpu_s.items()
                if self.ok + self.errors
            },
        }


@dataclass(frozen=True)
class Step:
    model: str
    side: str
    concurrency: int
    round: int


def schedule(
    models: Sequence[str], sides: Mapping[str, Sequence[str]], concurrencies: Sequence[int], rounds: int
) -> list[Step]:
    """The order of the steps: model by model (the peer serves one model at a time), then round
    by round, concurrency by concurrency, and within that every side of the model once, the order
    of the sides rotated by one each round so no side is always first after a change."""
    steps = []
    for model in models:
        model_sides = list(sides[model])
        for r in range(rounds):
            for i, concurrency in enumerate(concurrencies):
                shift = (r + i) % len(model_sides) if model_sides else 0
                for side in model_sides[shift:] + model_sides[:shift]:
                    steps.append(Step(model, side, concurrency, r))
    return steps


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | None  # None: not measured in this run
    target: str  # ">= 0.90", "<= 1.0 ms"
    unit: str = ""

    @property
    def passed(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        op, bound = self.target.split()[:2]
        return self.value >= float(bound) if op == ">=" else self.value <= float(bound)

    @property
    def mark(self) -> str:
        return {True: "pass", False: "falls short", None: "not measured"}[self.passed]


def _get(results: Mapping, model: str, side: str, concurrency: int, key: str) -> float | None:
    value = results.get(model, {}).get(side, {}).get(str(concurrency), {}).get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def target_figures(
    results: Mapping,
    extras: Mapping[str, float | None] | None = None,
    wire: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
) -> list[Figure]:
    """The targets table from ``results[model][side][str(concurrency)]`` summaries.

    ``extras``: ``start_to_ping_s`` and ``worker_rss_mb`` when measured; ``wire``: bytes to and
    from Triton per request, ``wire[model][side]`` (``scripts.bench.placement``)."""
    extras, wire = extras or {}, wire or {}
    figures = []
    for model in MODELS:
        for a_side in ("A-raw", "A-json"):
            figures.append(
                Figure(
                    f"{a_side} / B throughput, c=8, {model}",
                    _ratio(_get(results, model, a_side, 8, "throughput"), _get(results, model, "B", 8, "throughput")),
                    ">= 0.90",
                )
            )
    for peer, target in (("C-json", ">= 1.0"), ("C-binary", ">= 0.90")):
        for model in ("resnet", "bert_base"):
            figures.append(
                Figure(
                    f"A-raw / {peer} throughput, c=8, {model}",
                    _ratio(_get(results, model, "A-raw", 8, "throughput"), _get(results, model, peer, 8, "throughput")),
                    target,
                )
            )
    a, b = _get(results, IDENTITY, "A-raw", 1, "p50_ms"), _get(results, IDENTITY, "B", 1, "p50_ms")
    figures.append(
        Figure(
            f"router's own latency, A-raw p50 - B p50, c=1, {IDENTITY}",
            a - b if a is not None and b is not None else None,
            "<= 1.0 ms",
            " ms",
        )
    )
    figures.append(
        Figure(
            f"A-raw / B throughput, c=8, {IDENTITY}",
            _ratio(_get(results, IDENTITY, "A-raw", 8, "throughput"), _get(results, IDENTITY, "B", 8, "throughput")),
            ">= 0.5",
        )
    )
    figures.append(
        Figure(
            "dynamic batching on / off throughput (B), c=16, resnet",
            _ratio(
                _get(results, "resnet", "B", 16, "throughput"), _get(results, "resnet", "B-nobatch", 16, "throughput")
            ),
            ">= 1.3",
        )
    )
    figures.append(
        Figure(
            "raw body / base64 JSON throughput, c=8, resnet",
            _ratio(
                _get(results, "resnet", "A-raw", 8, "throughput"), _get(results, "resnet", "A-json", 8, "throughput")
            ),
            ">= 1.0",
        )
    )
    figures.extend(placement_figures(results, wire))
    figures.append(
        Figure(
            "serve start to /ping 200 (the benchmarked models + identity)",
            extras.get("start_to_ping_s"),
            "<= 20 s",
            " s",
        )
    )
    figures.append(
        Figure(
            "resident memory of one router worker after the mixed requests",
            extras.get("worker_rss_mb"),
            "<= 300 MB",
            " MB",
        )
    )
    return figures


def placement_figures(results: Mapping, wire: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[Figure]:
    """The image pipelines in Triton against the router's (the benchmark's own stack, c=8)."""
    figures = []
    fixed = _get(results, "bert_base", ROUTER_SIDE, 8, "router_cpu_ms")
    for model in ("resnet", "yolov5"):
        cpu = _get(results, model, TRITON_SIDE, 8, "router_cpu_ms")
        figures.append(
            Figure(
                f"router CPU per request, {model} {TRITON_SIDE} - bert_base {ROUTER_SIDE}, c=8",
                cpu - fixed if cpu is not None and fixed is not None else None,
                "<= 1.0 ms",
                " ms",
            )
        )
        sent = wire.get(model, {}).get(TRITON_SIDE, {})
        figures.append(
            Figure(
                f"bytes to Triton per request - the JPEG's size, {model} {TRITON_SIDE}",
                sent["to_triton"] - sent["input"] if sent else None,
                "<= 4096 B",
                " B",
            )
        )
        figures.append(
            Figure(f"bytes from Triton per request, {model} {TRITON_SIDE}", sent.get("from_triton"), "<= 16384 B", " B")
        )
        figures.append(
            Figure(
                f"{TRITON_SIDE} / {ROUTER_SIDE} throughput, c=8, {model}",
                _ratio(
                    _get(results, model, TRITON_SIDE, 8, "throughput"),
                    _get(results, model, ROUTER_SIDE, 8, "throughput"),
                ),
                ">= 1.0",
            )
        )
    graph = _get(results, "yolov5", TRITON_SIDE, 8, "triton_cpu_ms")
    step = _get(results, "yolov5", PYSTEP_SIDE, 8, "triton_cpu_ms")
    figures.append(
        Figure(
            f"Triton CPU per request, yolov5 {TRITON_SIDE} (NMS in the graph) - {PYSTEP_SIDE} (NMS in a python step), c=8",
            graph - step if graph is not None and step is not None else None,
            "<= 0 ms",
            " ms",
        )
    )
    return figures


def format_figures(figures: Iterable[Figure]) -> str:
    rows = [("figure", "value", "target", "mark")]
    for f in figures:
        value = "-" if f.passed is None else (f"{f.value:.2f}{f.unit}" if f.unit else f"{f.value:.3f}")
        rows.append((f.name, value, f.target, f.mark))
    return text_table(rows)


def format_results(results: Mapping) -> str:
    rows = [("model", "side", "c", "req/s", "p50 ms", "p95 ms", "p99 ms", "requests", "errors")]
    for model, sides in results.items():
        for side, by_c in sides.items():
            for c, s in by_c.items():
                rows.append(
                    (
                        model,
                        side,
                        c,
                        f"{s['throughput']:.1f}",
                        f"{s['p50_ms']:.1f}",
                        f"{s['p95_ms']:.1f}",
                        f"{s['p99_ms']:.1f}",
                        str(s["requests"]),
                        str(s["errors"]),
                    )
                )
    return text_table(rows, right=range(2, len(rows[0])))


def plot(results: Mapping, out: Path) -> list[Path]:
    if not results:  # a run of sections without throughput steps (the fixed cost alone)
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install -r requirements-dev.txt)", flush=True)
        return []
    written = []
    models = list(results)
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for side, by_c in results[model].items():
            cs = sorted(int(c) for c in by_c)
            ax.plot(cs, [by_c[str(c)]["throughput"] for c in cs], marker="o", label=side)
        ax.set_title(model)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("requests/s")
        ax.set_xticks(sorted({int(c) for by_c in results[model].values() for c in by_c}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    for model in models:
        sides = list(results[model])
        cs = sorted({int(c) for by_c in results[model].values() for c in by_c})
        fig, axes = plt.subplots(1, len(cs), figsize=(4 * len(cs), 4), squeeze=False)
        for ax, c in zip(axes[0], cs):
            width = 0.8 / 3
            for k, (q, key) in enumerate((("p50", "p50_ms"), ("p95", "p95_ms"), ("p99", "p99_ms"))):
                values = [results[model][s].get(str(c), {}).get(key, math.nan) for s in sides]
                ax.bar([i + (k - 1) * width for i in range(len(sides))], values, width, label=q)
            ax.set_xticks(range(len(sides)))
            ax.set_xticklabels(sides, rotation=30, fontsize=8)
            ax.set_title(f"{model}, c={c}")
            ax.set_ylabel("latency ms")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"latency-{model}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_results(path: Path, results: Mapping[str, Any], table: str, verdicts: str, noise: str = "") -> None:
    """A benchmark's product: results.json, then its table, the stack's sizing (where the run
    records one), the noise lines (if any) and the verdicts."""
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path}\n\n{table}\n", flush=True)
    if results.get("sizing"):
        print(f"serve: {results['sizing']}\n", flush=True)
    if noise:
        print(noise + "\n", flush=True)
    print(verdicts, flush=True)
