"""The text benchmark's pure parts (``scripts.bench.text``): its arguments, its rows and their
interleaving, the texts made to a token count, the figures, the goals' verdicts and the table. The
load itself needs a stack: ``tests/integration/test_bench_text.py`` runs it on tiny models."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from scripts.bench.report import Cell
from scripts.bench.text import plan, report
from scripts.bench.text.run import body


def words_and_specials(text: str) -> int:
    """A stand-in tokenizer: one token a word, and two special tokens."""
    return len(text.split()) + 2


def test_defaults_and_quick(tmp_path):
    args = plan.parse_args(["--out", str(tmp_path)])
    assert (args.concurrency, args.single_concurrency, args.lengths) == (8, 16, ["short", "long"])
    assert args.repository == (tmp_path / "repository").resolve()
    assert (args.small, args.no_prepare, args.env, args.argv) == (False, False, [], ["--out", str(tmp_path)])
    quick = plan.parse_args(["--quick", "--seconds", "30", "--rounds", "5"])
    assert (quick.rounds, quick.seconds) == (1, 0.2)  # a smoke run whatever else is asked
    assert plan.parse_args([]).out == plan.DEFAULT_OUT


def test_arguments_are_checked(tmp_path):
    given = plan.parse_args(["--lengths", "long", "--repository", str(tmp_path), "--env", "TRITON_THREADS=m=2"])
    assert given.lengths == ["long"] and given.repository == tmp_path.resolve()
    assert given.env == [("TRITON_THREADS", "m=2")]  # only the first "=" splits
    for wrong in (["--lengths", "medium"], ["--lengths", ","], ["--rounds", "0"], ["--env", "NOVALUE"]):
        with pytest.raises(SystemExit):
            plan.parse_args(wrong)


def test_every_family_at_every_length_then_the_comparison():
    rows = plan.plan_rows(["short", "long"], 8, 16)
    keys = [row.key for row in rows]
    assert len(keys) == len(set(keys)) == 2 * 4 + 2 * 3
    assert keys[:4] == [f"{family}/short" for family in plan.FAMILIES]
    sides = {row.key: row for row in rows if row.side}
    batch, single, encode = (sides[f"sentence_embedding/long/{side}"] for side in ("batch", "single", "encode"))
    assert (batch.texts, batch.concurrency, batch.kind) == (32, 8, plan.HTTP)
    assert (single.texts, single.concurrency, single.kind) == (1, 16, plan.HTTP)
    assert (encode.texts, encode.concurrency, encode.kind) == (32, 1, plan.ENCODE)
    assert [row.key for row in plan.plan_rows(["short"], 4, 2)][-1] == "sentence_embedding/short/encode"


def test_rounds_interleave_every_row_in_a_rotated_order():
    rows = plan.plan_rows(["short"], 8, 16)
    steps = plan.schedule(rows, 3)
    assert len(steps) == 3 * len(rows)
    for r in range(3):
        ran = [row for round_, row in steps if round_ == r]
        assert Counter(ran) == Counter(rows)  # every row once a round
        assert ran[0] == rows[r]  # the order rotates: no row always first
    assert [r for r, _ in steps] == sorted(r for r, _ in steps)  # round after round: A B, A B


def test_long_texts_sit_in_the_models_top_bucket():
    assert [plan.long_target(n) for n in (512, 256, 128, 64, 48)] == [496, 248, 124, 62, 46]
    assert plan.long_target(2) == 2


@pytest.mark.parametrize("target", [3, 10, 124, 496])
def test_texts_have_the_tokens_asked_for(target):
    texts = plan.make_texts(words_and_specials, target, 32, seed=1)
    assert len(texts) == 32 and len(set(texts)) > 1
    assert all(words_and_specials(text) == target for text in texts)
    assert texts == plan.make_texts(words_and_specials, target, 32, seed=1)  # seeded
    assert texts != plan.make_texts(words_and_specials, target, 32, seed=2)


def test_a_fill_mask_text_has_one_mask_and_a_tokenizer_that_splits_words_is_respected():
    masked = plan.make_texts(words_and_specials, 10, 4, mask=True)
    assert all(text.split().count("[MASK]") == 1 and words_and_specials(text) == 10 for text in masked)

    def pieces(text: str) -> int:  # every word two tokens: 10 is not reachable, 9 is the closest below
        return 2 * len(text.split()) + 2 - text.count("[MASK]")

    assert {pieces(text) for text in plan.make_texts(pieces, 11, 8)} == {10}
    assert plan.fit_text(pieces, 1, ["word"] * 4) == "word."  # at least one word, even over the target


def test_a_request_body_holds_one_text_or_a_list():
    texts = ["a b", "c d", "e f"]
    single = json.loads(body("m", texts, 1, 1))
    assert single == {"modelname": "m", "payload": {"text": "c d"}}
    many = json.loads(body("m", texts, 2, 4))
    assert many["payload"]["text"] == ["e f", "a b", "c d", "e f"]  # wraps around the row's texts


def cell(requests: int, seconds: float, cpu_s: dict[str, float], latency_s: float = 0.01) -> Cell:
    made = Cell()
    made.add([latency_s] * requests, 0, seconds, requests, "", cpu_s)
    return made


def test_figures_per_request_and_per_text():
    batch = plan.Row("sentence_embedding", "short", 32, 8, "batch")
    spent = {"router": 0.5, "triton": 8.0, "nginx": 0.05, "own": 0.2}
    made = report.figures(batch, [cell(20, 4.0, spent), cell(30, 6.0, spent)], 10.0)  # two rounds
    assert made["requests_per_s"] == pytest.approx(5.0) and made["texts_per_s"] == pytest.approx(160.0)
    assert made["router_cpu_ms"] == pytest.approx(20.0) and made["triton_cpu_ms"] == pytest.approx(320.0)
    assert made["network_cpu_ms_per_text"] == pytest.approx(10.0)  # Triton's CPU a text
    assert made["client_cpu_ms"] == pytest.approx(8.0) and made["requests"] == 50
    assert [r["requests_per_s"] for r in made["by_round"]] == [5.0, 5.0]
    assert [r["router_cpu_ms"] for r in made["by_round"]] == [pytest.approx(25.0), pytest.approx(50.0 / 3)]
    encode = plan.Row("sentence_embedding", "short", 32, 1, "encode")
    own = report.figures(encode, [cell(4, 2.0, {"own": 1.28, "router": 0.01})], 10.0)
    assert own["router_cpu_ms"] is None and own["client_cpu_ms"] is None  # the stack idles: no figure of it
    assert own["network_cpu_ms_per_text"] == pytest.approx(10.0)  # encode()'s CPU a text
    empty = report.figures(batch, [Cell()], 10.0)  # nothing done: no NaN in the JSON
    assert empty["p50_ms"] is None and empty["requests_per_s"] == 0.0
    assert not any(isinstance(v, float) and math.isnan(v) for v in empty.values())


def test_the_cpu_outside_the_benchmark_is_the_machines_less_ours():
    quiet = cell(10, 2.0, {"router": 0.4, "triton": 2.6, "nginx": 0.1, "own": 0.7, "machine": 3.85, "steal": 0.0})
    assert report.outside_cores(quiet) == pytest.approx(0.025)
    busy = cell(10, 2.0, {"router": 0.4, "triton": 2.6, "nginx": 0.1, "own": 0.7, "machine": 3.8, "steal": 0.2})
    assert report.outside_cores(busy) == pytest.approx(0.1)  # stolen time counts: the work did not run
    assert report.outside_cores(cell(1, 1.0, {"router": 0.1})) is None  # the machine was not read
    assert "outside CPU" not in report.progress_line(plan.Row("fill_mask", "short", 1, 8), quiet)
    loud = cell(10, 2.0, {"own": 0.5, "machine": 2.5, "steal": 0.0})
    assert "calls/s" in report.progress_line(plan.Row("sentence_embedding", "short", 32, 1, "encode"), loud)
    assert "outside CPU 1.00 cores" in report.progress_line(plan.Row("fill_mask", "short", 1, 8), loud)


def test_rounds_that_disagree_get_a_noise_line():
    steady = {"key": "a/short", "texts_per_request": 1, "by_round": [{"requests_per_s": 100.0, "outside_cores": 0.0}]}
    steady["by_round"].append({"requests_per_s": 124.0, "outside_cores": 0.01})
    jumpy = {"key": "b/short/encode", "texts_per_request": 32, "by_round": [dict(steady["by_round"][0])]}
    jumpy["by_round"].append({"requests_per_s": 1.875, "outside_cores": 0.93})
    single = {"key": "c/long", "texts_per_request": 1, "by_round": [{"requests_per_s": 1.0, "outside_cores": None}]}
    assert report.noise_lines([steady, jumpy, single]) == (
        "noise: b/short/encode: 3200.0, 60.0 texts/s by round (outside CPU 0.00, 0.93 cores)"
    )


def by_key(**values: dict) -> dict[str, dict]:
    return {key.replace("__", "/"): {"key": key.replace("__", "/"), **figures} for key, figures in values.items()}


def test_router_cpu_within_the_margin_of_the_fill_mask_passes():
    figures = by_key(
        fill_mask__short={"router_cpu_ms": 4.0},
        text_classification__short={"router_cpu_ms": 4.3},  # exactly the margin: passes
        token_classification__short={"router_cpu_ms": 4.31},
        sentence_embedding__short={"router_cpu_ms": 1.5},
    )
    verdicts = report.cpu_verdicts(figures, ["short"])
    assert [v["passed"] for v in verdicts] == [True, False, True]
    assert verdicts[1]["value"] == pytest.approx(0.31) and "4.31 vs 4.00 ms" in verdicts[1]["detail"]
    assert "by round" not in verdicts[1]["detail"]  # one round (none given): nothing to set side by side
    rounds = by_key(
        fill_mask__long={"router_cpu_ms": 4.0, "by_round": [{"router_cpu_ms": 4.2}, {"router_cpu_ms": 3.8}]},
        token_classification__long={"router_cpu_ms": 4.2, "by_round": [{"router_cpu_ms": 4.0}, {"router_cpu_ms": 4.4}]},
    )
    detail = report.cpu_verdicts(rounds, ["long"])[1]["detail"]
    assert detail == "4.20 vs 4.00 ms; by round -0.20, +0.60"
    missing = report.cpu_verdicts(by_key(text_classification__long={"router_cpu_ms": 1.0}), ["long"])
    assert [v["passed"] for v in missing] == [None, None, None]  # no fill-mask row: not measured, not a pass


def test_embeddings_ratios_against_encode():
    figures = by_key(
        sentence_embedding__short__encode={"texts_per_s": 400.0},
        sentence_embedding__short__batch={"texts_per_s": 400.0, "concurrency": 8},  # equal: the goal is met
        sentence_embedding__short__single={"texts_per_s": 180.0, "concurrency": 16},
    )
    batch, single = report.embedding_verdicts(figures, ["short"])
    assert (batch["value"], batch["passed"]) == (1.0, True)
    assert single["value"] == pytest.approx(0.45) and single["passed"] is False
    assert "c=16" in single["name"] and "180.0 vs 400.0 texts/s" in single["detail"]
    assert [v["passed"] for v in report.embedding_verdicts({}, ["long"])] == [None, None]


def test_verdict_lines_say_pass_fail_or_not_measured():
    lines = report.format_verdicts(
        [
            {"name": "cpu", "value": -0.5, "goal": "<= +0.30 ms", "passed": True, "detail": "1 vs 1.5 ms"},
            {"name": "ratio", "value": 0.8, "goal": ">= 1.00", "passed": False, "detail": "8 vs 10 texts/s"},
            {"name": "other", "value": None, "goal": ">= 0.50", "passed": None, "detail": "not measured"},
        ]
    ).splitlines()
    assert lines == [
        "PASS cpu: -0.50 ms (1 vs 1.5 ms; goal <= +0.30 ms)",
        "FAIL ratio: 0.80 (8 vs 10 texts/s; goal >= 1.00)",
        "n/a  other: — (not measured; goal >= 0.50)",
    ]


def test_the_table_is_markdown_with_one_line_a_row():
    rows = plan.plan_rows(["short"], 8, 16)
    cells = {row.key: [cell(20, 2.0, {"router": 0.04, "triton": 0.2, "nginx": 0.0})] for row in rows}
    cells["sentence_embedding/short/encode"] = [cell(3, 1.5, {"own": 0.3})]
    cells["text_classification/short"][0].add([], 2, 0.0, 0.0, "HTTP 500")
    args = plan.parse_args(["--lengths", "short", "--out", "build/x"])
    results = report.results(rows, cells, {(row.family, row.length): 10.0 for row in rows}, args, 3.5)
    json.dumps(results, allow_nan=False)  # plain JSON
    table = report.format_table(results["rows"]).splitlines()
    assert len(table) == 2 + len(rows)
    assert all(line.startswith("| ") and line.endswith(" |") and line.count("|") == 11 for line in table)
    assert table[1].startswith("| --- | --- | ---: |")
    encode_line = next(line for line in table if "SentenceTransformer.encode" in line)
    assert "| 1 | 2.0 | 64.0 |" in encode_line and "| — |" in encode_line  # 2 calls/s of 32 texts; no router
    assert "20 (2 errors)" in next(line for line in table if line.startswith("| text_classification, short |"))
    assert results["command"] == "python -m scripts.bench.text --lengths short --out build/x"
    assert len(results["verdicts"]) == 3 + 2 and Path(results["settings"]["repository"]).is_absolute()


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--seconds", "-1"], ["--concurrency", "x"]])
def test_counts_and_seconds_must_be_positive(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        plan.parse_args(argv)
    assert exited.value.code == 2 and argv[0] in capsys.readouterr().err
