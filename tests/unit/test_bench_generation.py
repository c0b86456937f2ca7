"""The generation benchmark's pure parts (``scripts.bench.generation``): its arguments, its rows and
the comparisons they feed, the settings of a call, the padded tokenizer, the figures, the verdicts
from a results dict and the table. The load itself needs a stack:
``tests/integration/test_bench_generation.py`` runs it on a tiny T5."""

from __future__ import annotations

import json
import math

import pytest

from scripts.bench.generation import plan, prepare, report, stack_side
from scripts.bench.report import Cell


def test_defaults_and_quick(tmp_path):
    args = plan.parse_args(["--out", str(tmp_path)])
    assert (args.concurrency, args.batch, args.beams, args.max_new_tokens) == (8, 8, 4, 32)
    assert (args.texts, args.text_tokens, args.small, args.no_prepare, args.env) == (32, 20, False, False, [])
    assert args.repository == (tmp_path / "repository").resolve() and args.argv == ["--out", str(tmp_path)]
    quick = plan.parse_args(["--quick", "--seconds", "30", "--rounds", "5"])
    assert (quick.rounds, quick.seconds, quick.warmup_seconds) == (1, 0.2, 0.1)  # a smoke run whatever is asked
    assert plan.parse_args([]).out == plan.DEFAULT_OUT


def test_arguments_are_checked(tmp_path):
    given = plan.parse_args(["--env", "TRITON_THREADS=bench_t5=2", "--env", "A=", "--beams", "0"])
    assert given.env == [("TRITON_THREADS", "bench_t5=2"), ("A", "")]  # only the first "=" splits
    assert given.beams == 0 and plan.parse_args(["--max-new-tokens", "512"]).max_new_tokens == 512
    for wrong in (["--env", "NOVALUE"], ["--env", "=1"], ["--beams", "9"], ["--beams", "-1"]):
        with pytest.raises(SystemExit):
            plan.parse_args(wrong)
    for wrong in (["--max-new-tokens", "513"], ["--rounds", "0"], ["--batch", "0"], ["--seconds", "-1"]):
        with pytest.raises(SystemExit):
            plan.parse_args(wrong)


def test_the_rows_and_what_they_are_compared_with():
    rows = plan.plan_rows(8, 8, 4)
    assert [row.key for row in rows] == [
        "endpoint/c8/greedy",
        "endpoint/c1/greedy",
        "generate/b1/greedy",
        "generate/b8/greedy",
        "endpoint/c8/beam4",
        "generate/b1/beam4",
    ]
    assert [row.key for row in plan.plan_rows(8, 8, 1)] == [row.key for row in rows[:4]]  # 0 or 1 beam: none
    assert len(plan.plan_rows(1, 1, 0)) == 2  # concurrency 1 and batch 1 asked for: each row once
    pairs = plan.goal_rows(8, 8, 4)
    assert {name: (a.key, b.key) for name, (a, b) in pairs.items()} == {
        "goal": ("endpoint/c8/greedy", "generate/b1/greedy"),
        "batch": ("endpoint/c8/greedy", "generate/b8/greedy"),
        "beam": ("endpoint/c8/beam4", "generate/b1/beam4"),
    }
    assert set(plan.goal_rows(8, 8, 0)) == {"goal", "batch"}
    assert "c=8" in rows[0].label and "batch 8" in rows[3].label and "4 beams" in rows[5].label


def test_every_call_generates_exactly_max_new_tokens():
    assert plan.payload_settings(32, 4) == {"max_new_tokens": 32, "min_new_tokens": 32, "num_beams": 4}


def test_the_vocabulary_is_padded_to_t5_smalls_after_the_trained_pieces_in_a_fixed_order():
    trained = [["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["▁b", -3.0], ["▁a", -3.000000001], ["x", -5.0]]
    found = prepare.padded_vocabulary(trained, 10)
    assert [piece for piece, _ in found[:6]] == ["<pad>", "</s>", "<unk>", "▁a", "▁b", "x"]  # equal scores: by piece
    assert [piece for piece, _ in found[6:]] == ["▁zq0", "▁zq1", "▁zq2", "▁zq3"]
    assert all(score < -5.0 for _, score in found[6:])  # below every trained piece: no text is cut into them
    assert prepare.corpus(20) == prepare.corpus(20) != prepare.corpus(20, seed=1)


def test_the_padded_tokenizer_decodes_its_dummy_pieces_and_never_encodes_into_them():
    tokenizer = prepare.t5_tokenizer()
    assert len(tokenizer) == prepare.VOCABULARY == 32_128
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    ids = tokenizer(" ".join(prepare.corpus(5))).input_ids
    trained = len(tokenizer) - sum(piece.startswith("▁zq") for piece in tokenizer.get_vocab())
    assert max(ids) < trained and ids[-1] == tokenizer.eos_token_id
    last = len(tokenizer) - 1
    assert tokenizer.decode([last, last], skip_special_tokens=True) == f"zq{last - trained} zq{last - trained}"


def cell(calls: int, seconds: float, cpu_s: dict[str, float], latency_s: float = 0.5) -> Cell:
    made = Cell()
    made.add([latency_s] * calls, 0, seconds, calls, "", cpu_s)
    return made


def test_figures_per_call_text_and_generated_token():
    served = plan.Row(plan.ENDPOINT, 8)
    spent = {"router": 0.04, "triton": 6.4, "nginx": 0.01, "own": 0.02}
    counts = [{"tokens": 320.0, "texts": 10.0, "executions": 2.0}, {"tokens": 320.0, "texts": 10.0, "executions": 3.0}]
    made = report.figures(served, [cell(10, 5.0, spent), cell(10, 5.0, spent)], counts)  # two rounds
    assert made["texts_per_execution"] == pytest.approx(4.0)  # Triton batched 20 texts in 5 executions
    assert made["requests_per_s"] == pytest.approx(2.0) and made["tokens_per_s"] == pytest.approx(64.0)
    assert made["tokens_per_text"] == pytest.approx(32.0) and made["router_cpu_ms"] == pytest.approx(4.0)
    assert made["triton_cpu_ms_per_token"] == pytest.approx(20.0) and made["cores"]["triton"] == pytest.approx(1.28)
    assert [r["tokens_per_s"] for r in made["by_round"]] == [64.0, 64.0]
    batched = plan.Row(plan.GENERATE, 1, 8)
    own = report.figures(batched, [cell(4, 2.0, {"own": 2.56, "router": 0.01, "triton": 0.01})], [{"tokens": 1024.0}])
    assert own["texts_per_s"] == pytest.approx(16.0) and own["tokens_per_text"] == pytest.approx(32.0)
    assert own["own_cpu_ms_per_token"] == pytest.approx(2.5)
    assert own["router_cpu_ms"] is None and own["triton_cpu_ms_per_token"] is None  # the stack idles
    assert own["texts_per_execution"] is None
    empty = report.figures(
        served, [Cell()], [{"tokens": 0.0, "texts": 0.0, "executions": 0.0}]
    )  # nothing done: no NaN in the JSON
    assert empty["p50_ms"] is None and empty["tokens_per_s"] == 0.0 and empty["tokens_per_text"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in empty.values())


def test_the_counters_of_the_model_are_read_from_both_pages():
    router = (
        '# TYPE router_generated_tokens_total counter\nrouter_generated_tokens_total{model="bench_t5"} 64.0\n'
        'router_generated_tokens_total{model="other"} 5.0\nrouter_generated_tokens_created{model="bench_t5"} 1.7e9\n'
    )
    triton = (
        'nv_inference_count{model="bench_t5",version="1"} 12\nnv_inference_exec_count{model="bench_t5",version="1"} 3\n'
        'nv_inference_count{model="bench_t5_x",version="1"} 99\n'
        'nv_inference_request_success{model="bench_t5",version="1"} 12\n'
    )
    assert stack_side.read_counters({"router": router, "triton": triton}) == {
        "tokens": 64.0,
        "texts": 12.0,
        "executions": 3.0,
    }
    assert stack_side.read_counters({"router": "", "triton": ""}) == {"tokens": 0.0, "texts": 0.0, "executions": 0.0}


def rows_of(**tokens_per_s: float) -> dict[str, dict]:
    return {key.replace("__", "/"): {"tokens_per_s": value} for key, value in tokens_per_s.items()}


def test_the_goal_is_one_and_a_half_times_generate_at_batch_one():
    figures = rows_of(
        endpoint__c8__greedy=150.0,
        generate__b1__greedy=100.0,  # exactly the goal: passes
        generate__b8__greedy=300.0,
        endpoint__c8__beam4=40.0,
        generate__b1__beam4=50.0,
    )
    goal, batch, beam = report.verdicts(figures, 8, 8, 4)
    assert (goal["value"], goal["passed"], goal["goal"]) == (1.5, True, ">= 1.50")
    assert "150.0 vs 100.0 tokens/s" in goal["detail"] and "c=8" in goal["name"]
    assert (batch["value"], batch["passed"], batch["goal"]) == (0.5, None, "")  # a ratio, no goal
    assert (beam["value"], beam["passed"]) == (0.8, None)
    figures["generate/b1/greedy"]["tokens_per_s"] = 100.1
    assert report.verdicts(figures, 8, 8, 4)[0]["passed"] is False
    missing = report.verdicts(rows_of(endpoint__c8__greedy=10.0, generate__b1__greedy=0.0), 8, 8, 0)
    assert [(v["value"], v["passed"]) for v in missing] == [(None, None), (None, None)]  # not measured, not a pass


def test_verdict_lines_pass_fail_then_the_ratios_without_a_goal():
    keys = ("name", "value", "goal", "passed", "detail")
    given = [
        ("goal", 1.6, ">= 1.50", True, "160 vs 100 tokens/s"),
        ("goal", 1.2, ">= 1.50", False, "120 vs 100 tokens/s"),
        ("batch", 0.5, "", None, "150 vs 300 tokens/s"),
        ("beam", None, "", None, "not measured"),
    ]
    lines = report.format_verdicts([dict(zip(keys, verdict)) for verdict in given]).splitlines()
    assert lines == [
        "PASS goal: 1.60 (160 vs 100 tokens/s; goal >= 1.50)",
        "FAIL goal: 1.20 (120 vs 100 tokens/s; goal >= 1.50)",
        "info batch: 0.50 (150 vs 300 tokens/s; no goal)",
        "info beam: — (not measured; no goal)",
    ]


def test_results_are_plain_json_and_the_table_has_a_line_a_row():
    args = plan.parse_args(["--out", "build/x", "--env", "TRITON_THREADS=bench_t5=2"])
    rows = plan.plan_rows(args.concurrency, args.batch, args.beams)
    cells = {row.key: [cell(8, 2.0, {"router": 0.02, "triton": 1.0, "own": 0.5, "machine": 1.6})] for row in rows}
    cells["endpoint/c1/greedy"][0].add([], 2, 0.0, 0.0, "HTTP 504")
    results = report.results(rows, cells, {row.key: [{"tokens": 256.0 * row.batch}] for row in rows}, args, 3.5)
    json.dumps(results, allow_nan=False)
    assert results["settings"]["env"] == {"TRITON_THREADS": "bench_t5=2"}
    assert results["settings"]["min_new_tokens"] == results["settings"]["max_new_tokens"] == 32
    assert results["command"].startswith("python -m scripts.bench.generation --out build/x")
    assert [v["passed"] for v in results["verdicts"]] == [False, None, None]  # 128 vs 128 tokens/s: 1.0
    table = report.format_table(results["rows"]).splitlines()
    assert len(table) == 2 + len(rows) and table[0].startswith("| row | texts/call |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "| 8 (2 errors) |" in table[3] and "| — |" in table[4]  # generate: no router figure
    label = report.progress_label(0, 2, rows[0], cells[rows[0].key][0], 256.0)
    assert label.startswith("round 1/2 endpoint/c8/greedy (128 tokens/s, router 2.50 ms/req")
