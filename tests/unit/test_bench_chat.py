"""The chat benchmark's pure parts (``scripts.bench.chat``): its arguments, its rows and the comparisons
they feed, the long generations' tokens, the padded tokenizer, the timing of a stream's events, the
figures, the verdicts and the table. The load itself needs a stack:
``tests/integration/test_bench_chat.py`` runs it on a tiny Llama."""

from __future__ import annotations

import json

import pytest

from scripts.bench.chat import endpoint, plan, prepare, report
from scripts.bench.report import Cell
from scripts.events import StreamFailed


def test_defaults_and_quick(tmp_path):
    args = plan.parse_args(["--out", str(tmp_path)])
    assert (args.concurrency, args.max_new_tokens, args.short_new_tokens, args.long_new_tokens) == (8, 64, 8, 256)
    assert (args.texts, args.text_tokens, args.small, args.generate_threads, args.env) == (32, 24, False, None, [])
    assert args.repository == (tmp_path / "repository").resolve() and args.argv == ["--out", str(tmp_path)]
    quick = plan.parse_args(["--quick", "--seconds", "30", "--rounds", "5"])
    assert (quick.rounds, quick.seconds, quick.warmup_seconds) == (1, 0.2, 0.1)  # a smoke run whatever is asked
    assert plan.parse_args([]).out == plan.DEFAULT_OUT
    for wrong in (["--long-new-tokens", "1025"], ["--concurrency", "0"], ["--env", "NOVALUE"], ["--seconds", "-1"]):
        with pytest.raises(SystemExit):
            plan.parse_args(wrong)


def test_the_shape_engine_and_weights_reach_the_model_toml(tmp_path):
    args = plan.parse_args(["--shape", "smollm2-135m", "--engine", "openvino", "--weights", "int8"])
    assert (args.shape, args.engine, args.weights) == ("smollm2-135m", "openvino", "int8")
    assert (plan.parse_args([]).shape, plan.parse_args([]).engine, plan.parse_args([]).weights) == (
        "llama-34m",
        "onnxruntime",
        "fp32",
    )
    with pytest.raises(SystemExit):  # int8 weights are the openvino engine's
        plan.parse_args(["--weights", "int8"])
    assert prepare.serving_toml("onnxruntime", "fp32") == ""
    assert prepare.serving_toml("openvino", "int8") == 'engine = "openvino"\nweights = "int8"\n'
    model = prepare.model_source(tmp_path, True, engine="openvino")  # the tiny Llama, on the openvino engine
    assert (model / "model.toml").read_text().endswith('transformers = "hf"\nengine = "openvino"\n')
    architecture, vocabulary = prepare.SHAPES["smollm2-135m"]
    assert (architecture["hidden_size"], architecture["num_hidden_layers"], vocabulary) == (576, 30, 49_152)
    assert prepare.build_of("smollm2-135m") != prepare.build_of("llama-34m")


def test_the_rows_and_what_they_are_compared_with():
    rows = plan.plan_rows(8)
    assert [row.key for row in rows] == [
        "generate",
        "endpoint/c8",
        "endpoint/c1",
        "stream/c8",
        "short-alone",
        "short-loaded",
        "follow-up",
        "json-schema/c8",  # the onnxruntime engine follows grammars
        "tool-calls/c8",
        "tools-auto/c8",  # the tool-calling row's reference: the same bodies, no grammar
    ]
    assert rows[5].concurrency == 7  # the short request and 7 long ones: 8 in all
    assert len(plan.plan_rows(1)) == 9  # concurrency 1 asked for: the endpoint's row once
    assert [row.key for row in plan.plan_rows(8, "openvino")][-2:] == ["genai/c1", "genai/c8"]
    pairs = plan.goal_rows(8)
    assert {name: (a.key, b.key) for name, (a, b) in pairs.items()} == {
        "tokens": ("endpoint/c8", "generate"),
        "ttft": ("short-loaded", "short-alone"),
        "constrained": ("json-schema/c8", "endpoint/c8"),
        "tools": ("tool-calls/c8", "tools-auto/c8"),
    }
    openvino = [row.key for row in plan.plan_rows(8, "openvino")]
    assert not {"json-schema/c8", "tool-calls/c8", "tools-auto/c8"} & set(openvino)
    labels = [row.label(64, 8, 256) for row in rows]
    assert "c=8" in labels[1] and "streamed" in labels[3] and "beside 7 of 256 tokens" in labels[5]
    assert "768 tokens sent before" in labels[6]


def test_the_long_generations_fit_the_models_positions():
    assert plan.long_tokens(256, 2048, 30) == 256
    assert plan.long_tokens(256, 128, 28) == 100  # the small model's 128 positions
    assert plan.long_tokens(256, None, 30) == 256 and plan.long_tokens(256, 10, 30) == 1


def test_the_vocabulary_is_padded_after_the_trained_pieces():
    found = prepare.padded_vocabulary({"<s>": 1, "<unk>": 0, "a": 2}, 6)
    assert list(found.items()) == [("<unk>", 0), ("<s>", 1), ("a", 2), ("▁zq0", 3), ("▁zq1", 4), ("▁zq2", 5)]
    with pytest.raises(ValueError):
        prepare.padded_vocabulary({"<unk>": 0, "a": 2})


def test_the_padded_tokenizer_decodes_every_id_and_never_encodes_into_the_padding():
    tokenizer = prepare.llama_tokenizer()
    assert len(tokenizer) == prepare.VOCABULARY == 32_000
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    ids = tokenizer(" ".join(prepare.corpus(5))).input_ids
    trained = len(tokenizer) - sum(piece.startswith("▁zq") for piece in tokenizer.get_vocab())
    assert ids[0] == tokenizer.bos_token_id and max(ids) < trained
    last = len(tokenizer) - 1
    assert tokenizer.decode([last, last]) == f"zq{last - trained} zq{last - trained}"


def event(index: int, text: str) -> bytes:
    return b"data: " + json.dumps({"index": index, "token": {"id": 10 + index, "text": text}}).encode() + b"\n\n"


def test_a_streams_tokens_are_timed_on_arrival_whatever_the_chunks():
    stream = event(0, "Hel") + event(1, "lo") + event(2, " you")
    parts = [stream[:5], stream[5:70], stream[70:]]  # cut inside events; two events in one part
    found = endpoint.timed_events(iter(parts), 0.0)
    assert found.text == "Hello you" and found.ids == (10, 11, 12) and len(found.arrivals) == 3
    assert list(found.arrivals) == sorted(found.arrivals) and found.ttft_s == found.arrivals[0]
    assert len(found.gaps_s) == 2 and all(gap >= 0 for gap in found.gaps_s)
    assert endpoint.timed_events(iter([b": keep-alive\n\n"]), 0.0).ttft_s is None
    with pytest.raises(StreamFailed):
        endpoint.timed_events(iter([event(0, "a"), b'data: {"error": "late", "error_type": "timeout"}\n\n']), 0.0)


def test_the_bodies_and_the_cancelled_counter():
    whole, streamed = (json.loads(endpoint.body("Hi", 64, stream)) for stream in (False, True))
    assert whole == {"modelname": plan.MODEL, "payload": {"text": "Hi", "max_new_tokens": 64}}
    assert streamed["payload"]["stream"] is True
    page = (
        '# TYPE router_generation_cancelled_total counter\nrouter_generation_cancelled_total{model="bench_llama"} 7.0\n'
        'router_generation_cancelled_total{model="other"} 3.0\n'
    )
    assert endpoint.read_cancelled(page) == 7.0 and endpoint.read_cancelled("") == 0.0


def cell(calls: int, seconds: float, cpu_s: dict[str, float], latency_s: float = 0.5) -> Cell:
    made = Cell()
    made.add([latency_s] * calls, 0, seconds, calls, "", cpu_s)
    return made


def test_figures_per_generated_token_and_the_streams_times():
    spent = {"router": 0.1, "triton": 1.0, "nginx": 0.01, "own": 0.05}
    stream = plan.Row(plan.STREAM, 8)
    counts = [{"tokens": 640, "ttft_s": [0.1] * 9 + [0.3], "gaps_s": [0.02] * 100}]
    made = report.figures(stream, [cell(10, 2.0, spent)], counts, "streamed")
    assert made["tokens_per_s"] == pytest.approx(320.0) and made["tokens_per_call"] == pytest.approx(64.0)
    assert made["ttft_p50_ms"] == pytest.approx(100.0) and made["ttft_p99_ms"] == pytest.approx(282.0)
    assert made["itl_p50_ms"] == pytest.approx(20.0) and made["first_tokens"] == 10
    assert made["triton_cpu_ms_per_token"] == pytest.approx(1000.0 / 640) and made["cores"]["triton"] == 0.5
    local = report.figures(plan.Row(plan.GENERATE), [cell(2, 2.0, spent)], [{"tokens": 128}], "generate")
    assert local["own_cpu_ms_per_token"] == pytest.approx(50.0 / 128) and local["triton_cpu_ms_per_token"] is None
    assert local["ttft_p50_ms"] is None  # not streamed
    probe = report.figures(
        plan.Row(plan.SHORT_LOADED, 7), [cell(5, 2.0, spent)], [{"tokens": 40, "ttft_s": [0.05]}], "p"
    )
    assert probe["tokens_per_s"] is None and probe["router_cpu_ms_per_token"] is None  # the long ones' CPU too
    empty = report.figures(stream, [Cell()], [{"tokens": 0}], "streamed")
    assert empty["p50_ms"] is None and empty["tokens_per_call"] is None and empty["ttft_p99_ms"] is None


def by_key(tokens: float, generate: float, loaded_ms: float, alone_ms: float) -> dict[str, dict]:
    return {
        "endpoint/c8": {"tokens_per_s": tokens, "label": "c8"},
        "endpoint/c1": {"tokens_per_s": tokens / 4, "label": "c1"},
        "generate": {"tokens_per_s": generate, "label": "generate"},
        "short-loaded": {"ttft_p50_ms": loaded_ms, "ttft_p99_ms": 2 * loaded_ms, "label": "loaded"},
        "short-alone": {"ttft_p50_ms": alone_ms, "ttft_p99_ms": 2 * alone_ms, "label": "alone"},
    }


def test_the_goals_three_times_the_tokens_and_at_most_three_times_the_first_token():
    tokens, ttft, single = report.verdicts(by_key(300.0, 100.0, 90.0, 30.0), 8)  # both exactly at the goal
    assert (tokens["value"], tokens["passed"], tokens["goal"]) == (3.0, True, ">= 3.00")
    assert (ttft["value"], ttft["passed"], ttft["goal"]) == (3.0, True, "<= 3.00")
    assert ttft["detail"] == "p50 90.0 vs 30.0 ms; p99 180.0 vs 60.0 ms"
    assert (single["value"], single["passed"], single["goal"]) == (0.75, None, "")
    tokens, ttft, _ = report.verdicts(by_key(299.0, 100.0, 90.1, 30.0), 8)
    assert tokens["passed"] is False and ttft["passed"] is False
    missing = report.verdicts(by_key(300.0, 0.0, 90.0, 0.0), 8)
    assert [(v["value"], v["passed"]) for v in missing] == [(None, None)] * 3  # not measured, not a pass


def test_results_are_plain_json_and_the_table_and_verdict_lines():
    args = plan.parse_args(["--out", "build/x"])
    args.long_new = 256
    rows = plan.plan_rows(args.concurrency)
    cells = {row.key: [cell(8, 2.0, {"router": 0.02, "triton": 1.0, "own": 0.5, "machine": 1.6})] for row in rows}
    made = {"tokens": 512, "ttft_s": [0.05, 0.06], "gaps_s": [0.02, 0.03]}
    results = report.results(rows, cells, {row.key: [made] for row in rows}, args, 3.5)
    json.dumps(results, allow_nan=False)
    assert results["command"] == "python -m scripts.bench.chat --out build/x"
    assert results["settings"]["long_new"] == 256 and results["settings"]["max_new_tokens"] == 64
    table = report.format_table(results["rows"]).splitlines()
    assert len(table) == 2 + len(rows) and table[0].startswith("| row | tokens/s | tokens/call |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    checks = {
        "same_as_generate": True,
        "stream_tokens_same_as_generate": True,
        "stream_same_as_whole": False,
        "tokens_of_the_first_answer": [64, 64, 64],
    }
    lines = report.format_verdicts(results["verdicts"], checks).splitlines()
    # 256 vs 256 tokens/s: generate's goal fails, the time to first token's and the constrained rows' pass
    assert [line.split(" ", 1)[0] for line in lines] == ["FAIL", "PASS", "PASS", "PASS", "info", "info"]
    assert lines[-1].endswith("the whole answer's text: False; tokens (generate, whole, streamed): 64, 64, 64")
    label = report.progress_label(0, 2, rows[3], cells[rows[3].key][0], made)
    assert label.startswith("round 1/2 stream/c8 (256 tokens/s, TTFT p50 55.0 ms")


def test_llama_cpp_s_rows_join_where_its_tree_is_given_and_are_held_to_the_endpoint():
    keys = [row.key for row in plan.plan_rows(8, "openvino", peer=True)]
    assert keys[-4:] == ["llama.cpp/c8", "llama.cpp/c1", "llama.cpp-stream/c8", "llama.cpp-follow-up"]
    found = {
        **by_key(300.0, 100.0, 90.0, 30.0),
        "stream/c8": {"ttft_p50_ms": 80.0, "label": "stream"},
        "follow-up": {"ttft_p50_ms": 40.0, "label": "turn"},
        "llama.cpp/c8": {"tokens_per_s": 250.0, "label": "llama c8"},
        "llama.cpp/c1": {"tokens_per_s": 80.0, "label": "llama c1"},
        "llama.cpp-stream/c8": {"ttft_p50_ms": 100.0, "label": "llama stream"},
        "llama.cpp-follow-up": {"ttft_p50_ms": 40.0, "label": "llama turn"},
    }
    peers = report.verdicts(found, 8)[-4:]
    assert [(v["goal"], v["passed"]) for v in peers] == [(">= 1.00", False), (">= 1.00", True), ("<= 1.00", True)] + [
        ("<= 1.00", True)
    ]
    assert peers[0]["value"] == 75.0 / 80.0 and peers[0]["detail"] == "75.0 vs 80.0 tokens/s"
    assert peers[2]["name"].endswith("ms, first token p50") and peers[2]["detail"] == "80.0 vs 100.0 ms"
    assert len(report.verdicts(by_key(300.0, 100.0, 90.0, 30.0), 8)) == 3  # no tree: no peer lines


def test_llama_cpp_s_stream_counts_the_tokens_an_event_held_back(tmp_path, monkeypatch):
    from scripts.bench.chat import llama_cpp

    def sent(made: int, tokens: list[int], content: str, stop: bool = False) -> bytes:
        body = {"content": content, "tokens": tokens, "stop": stop, "tokens_predicted": made}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    # the second and third tokens are one character's bytes: the third event brings both, listing one
    stream = sent(1, [5], "a") + sent(3, [7], "\u00e9") + sent(4, [8], "b") + sent(4, [], "", stop=True)
    caller = llama_cpp.LlamaCaller(1, [[1, 2, 3]], 4, True, 5.0)
    found = caller.streamed(iter([stream[:40], stream[40:]]), 0.0)
    assert len(found.arrivals) == 4 and found.text == "a\u00e9b" and found.ids == (5, 7, 8)
    assert json.loads(caller.bodies[0]) == {
        "prompt": [1, 2, 3],
        "n_predict": 4,
        "temperature": 0.0,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": True,
    }
    assert llama_cpp.gguf_type("fp32") == "f32" and llama_cpp.gguf_type("int4") == "q8_0"
    # no tree given or in the environment: no peer; a tree without its server: one line naming it
    monkeypatch.delenv(llama_cpp.ENV, raising=False)
    assert llama_cpp.located(None) is None
    (tmp_path / llama_cpp.CONVERTER).write_text("")
    with pytest.raises(SystemExit, match="no build/bin/llama-server in .*: build it with cmake"):
        llama_cpp.located(tmp_path)
