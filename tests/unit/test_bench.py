"""The benchmark's pure parts: percentiles, a process's CPU seconds, throughput inside a window, the
interleaving schedule, the targets table. (The load itself needs a running stack: `make bench`.)"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from app.core.procfs import process_stat
from clients.families import load_spec
from scripts.bench.load import window_work
from scripts.bench.payloads import preprocessed_tensors
from scripts.bench.peers import _without_dynamic_batching
from scripts.bench.placement import cpu_seconds
from scripts.bench.report import Cell, Figure, format_figures, schedule, target_figures
from scripts.devtools import built_test_repository, percentile
from scripts.model_prep import triton_config
from tests.support import wiring_problems


@pytest.mark.parametrize("q", [0, 1, 50, 95, 99, 100])
@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy_linear(q, n):
    values = list(np.random.default_rng(n).exponential(10.0, n))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edges():
    assert math.isnan(percentile([], 50))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order does not matter
    with pytest.raises(ValueError):
        percentile([1.0], 101)


BURN_A_THREAD = """
import os, sys, threading, time
def burn():
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
worker = threading.Thread(target=burn)
worker.start()
worker.join()
while len(os.listdir("/proc/self/task")) > 1:  # join() returns a moment before the thread's task ends
    time.sleep(0.001)
print("done", flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_counts_ended_threads_to_the_nanosecond():
    """A process's CPU seconds as the benchmarks read them: a thread that has ended still counts, the
    figure agrees with /proc's clock ticks within two ticks, and it is not rounded to a tick."""
    ticks = os.sysconf("SC_CLK_TCK")
    child = subprocess.Popen([sys.executable, "-c", BURN_A_THREAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"done\n"
        assert os.listdir(f"/proc/{child.pid}/task") == [str(child.pid)]  # the burning thread has ended
        seconds = cpu_seconds(child.pid)
        stat = process_stat(child.pid)
        assert seconds >= 0.3
        assert abs(seconds - stat.cpu_ticks / ticks) <= 2 / ticks
        assert round(seconds * 1e9) % (10**9 // ticks) != 0  # not a whole number of ticks
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert cpu_seconds(child.pid) == 0.0  # gone


def test_window_work_counts_the_share_inside():
    # window [10, 20]: one request inside, one half in at each end, one wholly after.
    spans = [(11.0, 12.0), (9.0, 11.0), (19.0, 21.0), (20.5, 21.0)]
    assert window_work(spans, 10.0, 20.0) == pytest.approx(2.0)


def test_window_work_of_a_steady_closed_loop_is_rate_times_window():
    # 4 threads, each back-to-back requests of 0.3 s starting at different offsets.
    spans = [(t0 + k * 0.3, t0 + (k + 1) * 0.3) for t0 in (0.0, 0.1, 0.2, 0.05) for k in range(40)]
    assert window_work(spans, 2.0, 8.0) == pytest.approx(4 / 0.3 * 6.0)


def test_cell_summary():
    cell = Cell()
    cell.add([0.010, 0.020], errors=1, seconds=2.0, work=3.0, first_error="HTTP 503")
    cell.add([0.030, 0.040], errors=0, seconds=2.0, work=5.0)
    s = cell.summary()
    assert s["throughput"] == pytest.approx(2.0)
    assert s["p50_ms"] == pytest.approx(25.0)
    assert s["requests"] == 4 and s["errors"] == 1 and s["first_error"] == "HTTP 503"


def test_schedule_interleaves_every_side_each_round_and_rotates():
    sides = {"resnet": ["A-json", "A-raw", "B", "C-json", "C-binary"], "bert_base": ["A-json", "B"]}
    steps = schedule(["resnet", "bert_base"], sides, [1, 8], rounds=3)
    assert len(steps) == (5 + 2) * 2 * 3
    # model by model: the peer serves one at a time
    models = [s.model for s in steps]
    assert models == ["resnet"] * 30 + ["bert_base"] * 12
    # every (side, concurrency) once per round
    counts = Counter((s.model, s.side, s.concurrency, s.round) for s in steps)
    assert set(counts.values()) == {1}
    # the sides of one (round, concurrency) come back to back, in a rotated order
    firsts = [steps[i].side for i in range(0, 30, 5)]
    assert len(set(firsts)) > 1
    block = steps[5:10]
    assert {s.side for s in block} == set(sides["resnet"]) and {s.concurrency for s in block} == {8}
    # rounds in order: round r's steps all come before round r + 1's
    resnet_rounds = [s.round for s in steps if s.model == "resnet"]
    assert resnet_rounds == sorted(resnet_rounds)


def _summary(throughput, p50=10.0):
    return {"throughput": throughput, "p50_ms": p50, "p95_ms": p50, "p99_ms": p50, "requests": 1, "errors": 0}


def test_target_figures_ratios_and_marks():
    results = {
        "resnet": {
            "A-raw": {"8": _summary(45.0)},
            "A-json": {"8": _summary(40.0)},
            "B": {"8": _summary(50.0), "16": _summary(52.0)},
            "B-nobatch": {"16": _summary(40.0)},
            "C-json": {"8": _summary(30.0)},
            "C-binary": {"8": _summary(50.0)},
        },
        "identity": {"A-raw": {"1": _summary(300.0, p50=1.6)}, "B": {"1": _summary(2000.0, p50=0.4)}},
    }
    figures = {f.name: f for f in target_figures(results, {"start_to_ping_s": 12.0})}
    f = figures["A-raw / B throughput, c=8, resnet"]
    assert f.value == pytest.approx(0.9) and f.passed is True
    assert figures["A-json / B throughput, c=8, resnet"].passed is False
    assert figures["A-raw / C-json throughput, c=8, resnet"].value == pytest.approx(1.5)
    assert figures["A-raw / C-binary throughput, c=8, resnet"].passed is True  # 0.9 >= 0.90
    router = figures["router's own latency, A-raw p50 - B p50, c=1, identity"]
    assert router.value == pytest.approx(1.2) and router.passed is False
    assert figures["dynamic batching on / off throughput (B), c=16, resnet"].value == pytest.approx(1.3)
    assert figures["raw body / base64 JSON throughput, c=8, resnet"].passed is True
    assert figures["A-raw / B throughput, c=8, yolov5"].passed is None  # not measured
    assert figures["serve start to /ping 200 (the benchmarked models + identity)"].passed is True
    text = format_figures(figures.values())
    assert "falls short" in text and "not measured" in text and ">= 0.90" in text


def test_figure_marks():
    assert Figure("x", 1.0, "<= 1.0 ms", " ms").mark == "pass"
    assert Figure("x", 1.01, "<= 1.0 ms", " ms").mark == "falls short"
    assert Figure("x", None, ">= 1.3").mark == "not measured"
    assert Figure("x", math.nan, ">= 1.3").passed is None


def test_nobatch_config_drops_dynamic_batching_only():
    config = (
        'name: "resnet"\nmax_batch_size: 8\ninput { name: "input" data_type: TYPE_FP32 dims: [3, 224, 224] }\n'
        'dynamic_batching { max_queue_delay_microseconds: 2000 }\nbackend: "python"\n'
    )
    out = _without_dynamic_batching(triton_config.parse(config), "resnet_nobatch")
    assert 'name: "resnet_nobatch"' in out and "dynamic_batching" not in out
    assert "max_batch_size: 8" in out and 'backend: "python"' in out


def test_model_only_tensors_are_the_clients_own(tmp_path):
    """Side B sends what the router would: the model's client preprocesses the sample (batch of one)."""
    from PIL import Image

    from app.core.settings import Settings
    from clients.families import build_registry

    image = tmp_path / "sample.jpg"
    Image.radial_gradient("L").convert("RGB").resize((320, 240)).save(image, "JPEG")
    repository = built_test_repository()
    registry = build_registry(repository, triton=None, settings=Settings())
    for name, item in (("resnet", image.read_bytes()), ("bert_base", "Paris is the [MASK] of France.")):
        client = registry[name]
        tensors, outputs = preprocessed_tensors(load_spec(repository / name), image, "Paris is the [MASK] of France.")
        arrays, _ = client.preprocess(item, "sample", client.parse_options({}))
        assert outputs == [t.name for t in client.spec.outputs]
        for tensor in client.spec.inputs:
            assert tensors[tensor.name].shape == (1, *tensor.dims)
            assert tensors[tensor.name].dtype == tensor.numpy_dtype
            np.testing.assert_array_equal(tensors[tensor.name][0], arrays[tensor.name].astype(tensor.numpy_dtype))
    # a detector whose graph post-processes: its image, the letterbox's geometry and the options go to
    # the network, which answers the detections
    tensors, outputs = preprocessed_tensors(load_spec(repository / "yolov5"), image, "")
    assert list(tensors) == ["images", "image_size", "letterbox", "conf_threshold", "iou_threshold", "max_detections"]
    assert tensors["image_size"].tolist() == [[240, 320]] and outputs == ["detections", "num_detections"]


def test_placement_figures_compare_the_two_pipelines_and_the_wire():
    results = {
        "resnet": {
            "P-triton": {"8": {**_summary(30.0), "router_cpu_ms": 3.2}},
            "P-router": {"8": {**_summary(25.0), "router_cpu_ms": 7.0}},
        },
        "yolov5": {"P-triton": {"8": {**_summary(10.0), "router_cpu_ms": 4.0}}},
        "bert_base": {"P-router": {"8": {**_summary(80.0), "router_cpu_ms": 2.5}}},
    }
    wire = {"resnet": {"P-triton": {"to_triton": 48_500, "from_triton": 8_100, "input": 48_000}}}
    figures = {f.name: f for f in target_figures(results, {}, wire)}
    cpu = figures["router CPU per request, resnet P-triton - bert_base P-router, c=8"]
    assert cpu.value == pytest.approx(0.7) and cpu.passed is True
    assert figures["router CPU per request, yolov5 P-triton - bert_base P-router, c=8"].passed is False
    assert figures["bytes to Triton per request - the JPEG's size, resnet P-triton"].value == 500
    assert figures["bytes from Triton per request, resnet P-triton"].passed is True
    assert figures["bytes from Triton per request, yolov5 P-triton"].passed is None  # not measured
    assert figures["P-triton / P-router throughput, c=8, resnet"].value == pytest.approx(1.2)


def test_cell_cpu_is_per_request_done():
    cell = Cell()
    cell.add([0.1] * 9, 1, 1.0, 10.0, "", {"router": 0.05, "triton": 0.5})
    cell.add([0.1] * 10, 0, 1.0, 10.0, "", {"router": 0.05, "triton": 0.5})
    summary = cell.summary()
    assert summary["router_cpu_ms"] == pytest.approx(5.0) and summary["triton_cpu_ms"] == pytest.approx(50.0)


def test_the_bench_stack_serves_both_placements(tmp_path):
    from clients.families import find_specs
    from scripts.bench.peers import write_bench_repositories

    repository = built_test_repository()
    specs = find_specs(repository)
    stack_repo, _ = write_bench_repositories(tmp_path, repository, specs)
    served = find_specs(stack_repo)
    assert served["resnet"].pipeline == "triton" and served["resnet_router"].pipeline == "router"
    assert served["yolov5_router"].pipeline == "router" and "bert_base_router" not in served
    assert triton_config.read_config(stack_repo / "resnet_router" / "config.pbtxt").name == "resnet_router"
    for step in ("resnet_preprocess", "resnet_pipeline", "yolov5_pystep_postprocess", "yolov5_pystep_pipeline"):
        assert (stack_repo / step / "config.pbtxt").is_file()
    # the router's copy and the python step's serve the raw network: its image in, its raw output out
    for copy in ("yolov5_router", "yolov5_pystep"):
        config = triton_config.read_config(stack_repo / copy / "config.pbtxt")
        assert [t.name for t in config.input] == ["images"] and [t.name for t in config.output] == ["output"]
        graph = onnx.load(str(stack_repo / copy / "1" / "model.onnx")).graph
        assert [i.name for i in graph.input] == ["images"] and [o.name for o in graph.output] == ["output"]
    assert served["yolov5_pystep"].pipeline == "triton"
    assert wiring_problems(stack_repo, "yolov5_pystep_pipeline") == []


SIZED_CONFIG = (
    'name: "resnet_preprocess"\nmax_batch_size: 8\nbackend: "python"\n'
    "instance_group { count: 2 kind: KIND_CPU }\ninstance_group { count: 3 kind: KIND_GPU }\n"
    "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
    'parameters { key: "sizing" value { string_value: "instances" } }\n'
)


def test_count_one_sets_every_instance_count_and_nothing_else():
    from scripts.bench.sized_counts import count_one_text

    config = triton_config.parse(count_one_text(SIZED_CONFIG))
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (1, config.instance_group[0].KIND_CPU),
        (1, config.instance_group[0].KIND_GPU),
    ]
    before = triton_config.parse(SIZED_CONFIG)
    for group in before.instance_group:
        group.count = 1
    assert config == before  # the batching, the backend and the parameters as they were
    ensemble = 'name: "resnet_pipeline"\nplatform: "ensemble"\nmax_batch_size: 8\n'
    assert count_one_text(ensemble) == ensemble


def test_configuration_shows_instances_and_threads():
    from scripts.bench.sized_counts import configuration

    network = (
        'name: "resnet"\nbackend: "python"\ninstance_group { count: 2 kind: KIND_CPU }\n'
        'parameters { key: "ort_intra_op_threads" value { string_value: "%s" } }\n'
    )
    assert configuration(network % "3") == "2 x 3"
    assert configuration(network % "0") == "2 x default"
    dali = 'name: "p"\nbackend: "dali"\ninstance_group { count: 2 kind: KIND_GPU }\n'
    assert configuration(dali + 'parameters { key: "num_threads" value { string_value: "4" } }\n') == "2/GPU x 4"
    assert configuration(SIZED_CONFIG) == "5/GPU"  # a python step: no threads parameter
    assert configuration('name: "e"\nplatform: "ensemble"\n') == "-"


def test_count_one_repository_links_the_models_and_keeps_their_threads(tmp_path):
    from scripts.bench.sized_counts import configurations, count_one_repository, pipeline_members

    repository = built_test_repository()
    target = count_one_repository(repository, tmp_path / "count-1")
    members = pipeline_members(repository, "resnet")
    assert members == ["resnet_pipeline", "resnet_preprocess", "resnet"]
    weights = Path("resnet", "1", "model.onnx")
    assert (target / weights).resolve() == (repository / weights).resolve()  # the files are the repository's
    assert (target / "resnet" / "model.toml").is_symlink()
    shown = configurations(target, members)
    written = configurations(repository, members)
    assert set(shown) == {"resnet_preprocess", "resnet"}
    for name, text in shown.items():
        assert text.split(" x ")[0] == "1"
        assert text.partition(" x ")[2] == written[name].partition(" x ")[2]  # threads as prepared


def test_format_sizing_sets_the_sides_side_by_side():
    from scripts.bench.sized_counts import COUNT_ONE_SIDE, SIZED_SIDE, format_sizing, sizing_results

    cells = {"resnet": {SIZED_SIDE: {"8": Cell()}, COUNT_ONE_SIDE: {"8": Cell()}}}
    cells["resnet"][SIZED_SIDE]["8"].add([0.1] * 30, 0, 2.0, 30.0)
    cells["resnet"][COUNT_ONE_SIDE]["8"].add([0.2] * 20, 1, 2.0, 20.0, "RpcError: boom")
    results = sizing_results(cells, {"budget": 2}, {"resnet": ["resnet_pipeline"]}, {})
    assert results["models"]["resnet"]["ratio"] == pytest.approx(1.5)
    results["models"]["resnet"]["configurations"] = {
        SIZED_SIDE: {"resnet_preprocess": "4", "resnet": "2 x 2"},
        COUNT_ONE_SIDE: {"resnet_preprocess": "1", "resnet": "1 x default"},
    }
    text = format_sizing(results)
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("resnet "))
    assert row[:6] == ["resnet", "15.0", "100.0", "10.0", "200.0", "1.50"]
    assert any(line.split() == ["resnet", "2", "x", "2", "1", "x", "default"] for line in text.splitlines())
    assert "count 1's first error: RpcError: boom" in text
