"""The text_generation family's OpenVINO engine at preparation (``[export] engine = "openvino"``): the
IR is prepared beside the checked ONNX graph and held to ``generate``; a folder the engine cannot serve
as ``generate`` does (sliding-window attention), or an engine this project does not have, stops
preparation with one line saying why and what to do instead."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from app.core.causal_lm_contract import GRAPH_FILE, IR_FILE, IR_WEIGHTS
from scripts.model_prep.onnx_export import REPORT_FILE
from scripts.model_prep.small_models.sets import Built


def prepared(tmp_path: Path, capsys, source: Path, name: str, engine: str, extra: str = "") -> tuple[int, str, str]:
    """``python -m scripts.model_prep`` of one folder of the causal set, its model.toml naming ``engine``
    (and ``extra``, more of its [export] table): the exit code, what it printed and its error lines."""
    from scripts.model_prep import cli

    models = tmp_path / "models"
    shutil.copytree(source / name, models / name)
    toml = models / name / "model.toml"
    toml.write_text(toml.read_text() + f'engine = "{engine}"\n{extra}')
    capsys.readouterr()
    argv = ["--source", str(models), "--repository", str(tmp_path / "repository"), "--cache-dir", str(tmp_path / "c")]
    code = cli.main([*argv, "--weights", "small"])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def test_the_version_folder_holds_the_ir_beside_the_graph_and_preparation_says_what_it_checked(small_models: Built):
    repository = small_models.repository("causal_openvino")
    for name in small_models.models("causal_openvino").iterdir():
        version = repository / name.name / "1"
        assert sorted(p.name for p in version.iterdir()) == sorted([GRAPH_FILE, IR_FILE, IR_WEIGHTS, "model.py"])
        source = json.loads((repository / name.name / "source.json").read_text())
        assert source["weights"] == "file", name


def test_a_sliding_window_folder_is_refused_in_one_line_naming_the_other_engine(small_models: Built, tmp_path, capsys):
    code, _, err = prepared(tmp_path, capsys, small_models.models("causal"), "mistral_random", "openvino")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "mistral_random" in err and "sliding_window 8 of its 128 positions" in err
    assert 'engine = "onnxruntime"' in err


def test_an_engine_the_project_has_not_is_refused_naming_those_it_has(small_models: Built, tmp_path, capsys):
    code, _, err = prepared(tmp_path, capsys, small_models.models("causal"), "llama_random", "vllm")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "engine = 'vllm'" in err and "'onnxruntime', 'openvino'" in err


def test_the_engine_s_check_is_printed_and_a_second_preparation_reads_the_cache(small_models: Built, tmp_path, capsys):
    code, out, err = prepared(tmp_path, capsys, small_models.models("causal"), "gpt2_random", "openvino")
    assert code == 0, err
    assert "converting the model to a stateful OpenVINO IR" in out
    assert "checking the IR (OpenVINO GenAI's continuous batching, float32, greedy vs generate)" in out
    config = json.loads((small_models.models("causal") / "gpt2_random" / "hf" / "config.json").read_text())
    layers, heads, width = config["n_layer"], config["n_head"], config["n_embd"] // config["n_head"]
    per_token = 2 * layers * heads * width * 4  # keys and values, float32
    assert f"key/value cache: {per_token:,} bytes a token ({layers} layers x {heads} heads x {width} x" in out
    assert f"the {config['n_positions']:,}-token context takes 0.00 GB a row: kv_cache_gb 1 by default, " in out
    assert f"{2**30 // per_token:,} tokens" in out
    from scripts.model_prep import cli

    argv = ["--source", str(tmp_path / "models"), "--repository", str(tmp_path / "again"), "--cache-dir"]
    assert cli.main([*argv, str(tmp_path / "c"), "--weights", "small"]) == 0
    again = capsys.readouterr().out
    assert "from the cache" in again and "converting" not in again
    assert (tmp_path / "again" / "gpt2_random" / "1" / IR_FILE).is_file()


@pytest.mark.parametrize(("weights", "size"), [("int8", 0.6), ("int4", 0.45)])
def test_quantized_weights_are_checked_against_float32_and_refused_under_the_threshold(
    small_models: Built, tmp_path, capsys, monkeypatch, weights, size
):
    import contextlib

    from clients.families import load_spec
    from scripts.model_prep import causal_lm_checks as checks
    from scripts.model_prep import causal_lm_openvino
    from scripts.model_prep.onnx_export import ExportError

    # the set's quantized Llama: its weights a fraction of the float32 graph's (the float32 embedding
    # table kept), its agreement in the report
    version = small_models.repository("causal_openvino") / f"llama_{weights}" / "1"
    graph = small_models.repository("causal") / "llama_trained" / "1" / GRAPH_FILE
    assert (version / IR_WEIGHTS).stat().st_size < size * graph.stat().st_size
    [report] = (small_models.cache / "onnx" / f"llama_{weights}").glob(f"*/{REPORT_FILE}")
    found = json.loads(report.read_text())
    assert found["weights"] == weights and 0.9 <= found[f"{weights}_agreement"] <= 1, found
    assert 0 <= found[f"{weights}_mean_abs_logprob_diff"] < (0.1 if weights == "int8" else 0.3)
    # quantizing a float32 IR again: the figures printed, then refused where no agreement is enough
    spec = load_spec(small_models.models("causal_openvino") / "llama_openvino")
    fp32 = small_models.repository("causal_openvino") / "llama_openvino" / "1"

    def quantized():
        folder = tmp_path / f"ir{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        for name in (IR_FILE, IR_WEIGHTS):
            shutil.copy(fp32 / name, folder / name)
        return causal_lm_openvino.quantized(spec, folder, lambda *_: contextlib.nullcontext(), weights)

    capsys.readouterr()
    figures = quantized()
    [line] = [line for line in capsys.readouterr().out.splitlines() if f"{weights} weights:" in line]
    assert "greedy next-token agreement with float32" in line and "(at least 90% taken)" in line, line
    assert f"{100 * figures[f'{weights}_agreement']:.1f}%" in line
    monkeypatch.setattr(checks, "MIN_AGREEMENT", 1.01)  # no agreement is enough
    with pytest.raises(ExportError, match=f"its {weights} weights answer too far from float32: .* under 101%"):
        quantized()
    # unless model.toml takes less: its [export] min_agreement named in the line
    spec = dataclasses.replace(spec, export={**spec.export, "min_agreement": 0.5})
    quantized()
    assert "(at least 50% taken, [export] min_agreement)" in capsys.readouterr().out
    for wrong in (1.5, "high", True):
        with pytest.raises(ExportError, match=rf"\[export\] min_agreement = {wrong!r}: a number from 0 to 1"):
            checks.min_agreement(dataclasses.replace(spec, export={**spec.export, "min_agreement": wrong}))


@pytest.mark.parametrize("line", ['weights = "int8"', 'precision = "bf16"'])
def test_int8_weights_or_bf16_without_the_openvino_engine_are_refused_naming_it(
    small_models: Built, tmp_path, capsys, line
):
    code, _, err = prepared(tmp_path, capsys, small_models.models("causal"), "llama_random", "onnxruntime", line + "\n")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert line.replace('"', "'") in err and 'with [export] engine = "openvino"' in err


def test_bf16_arithmetic_is_checked_against_float32_and_refused_under_the_threshold(
    small_models: Built, tmp_path, capsys, monkeypatch
):
    import contextlib

    from clients.families import load_spec
    from scripts.model_prep import causal_lm_checks as checks
    from scripts.model_prep import causal_lm_openvino
    from scripts.model_prep.onnx_export import ExportError

    # the set's trained Llama in bf16: its agreement in the report
    [report] = (small_models.cache / "onnx" / "llama_bf16").glob(f"*/{REPORT_FILE}")
    found = json.loads(report.read_text())
    assert found["precision"] == "bf16" and found["weights"] == "fp32" and 0.9 <= found["bf16_agreement"] <= 1, found
    # the float32 IR checked in bf16: the figures printed (its weights left as they are), then refused
    spec = load_spec(small_models.models("causal_openvino") / "llama_openvino")
    fp32 = small_models.repository("causal_openvino") / "llama_openvino" / "1"
    folder = tmp_path / "ir"
    folder.mkdir()
    for name in (IR_FILE, IR_WEIGHTS):
        shutil.copy(fp32 / name, folder / name)

    def checked():
        return causal_lm_openvino.quantized(spec, folder, lambda *_: contextlib.nullcontext(), "fp32", "bf16")

    capsys.readouterr()
    figures = checked()
    [line] = [line for line in capsys.readouterr().out.splitlines() if "bf16 arithmetic:" in line]
    assert f"greedy next-token agreement with float32 {100 * figures['bf16_agreement']:.1f}%" in line, line
    assert (folder / IR_WEIGHTS).read_bytes() == (fp32 / IR_WEIGHTS).read_bytes()
    monkeypatch.setattr(checks, "MIN_AGREEMENT", 1.01)
    with pytest.raises(ExportError, match="its bf16 arithmetic answer too far from float32: .* under 101%"):
        checked()
