"""The text_generation family's preparation: each architecture's small folder (the "causal" set of
scripts.model_prep.small_models, prepared by ``python -m scripts.model_prep``) becomes a decoupled
python-backend model over one checked graph, ``decoder.onnx``; what cannot be served that way stops
preparation with one line naming the folder, its model_type and what failed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.core.causal_lm_contract import ARCHITECTURES, GRAPH_FILE, SETTING_NAMES, inputs, outputs
from app.core.spec import SpecError
from scripts.model_prep.small_models.causal import SENTENCES
from scripts.model_prep.small_models.encoders import write_model_toml
from scripts.model_prep.small_models.sets import SETS, Built
from tests.references import prepare_text_repository

MODELS = {name: options["architecture"] for name, (_, options) in SETS["causal"].models.items()}


@pytest.fixture(scope="module")
def built(small_models: Built) -> tuple[Path, Path]:
    return small_models.models("causal"), small_models.repository("causal")


def some_models(models: Path, target: Path, *names: str) -> Path:
    """A source folder of the set's ``names`` only."""
    for name in names:
        shutil.copytree(models / name, target / name)
    return target


def refused(tmp_path: Path, capsys, models: Path, *extra: str) -> str:
    """The one line ``python -m scripts.model_prep`` stops with."""
    from scripts.model_prep import cli

    capsys.readouterr()
    argv = ["--source", str(models), "--repository", str(tmp_path / "repository"), "--cache-dir", str(tmp_path / "c")]
    assert cli.main([*argv, *extra]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_set_holds_every_architecture_the_family_serves(built):
    found = {json.loads((built[0] / name / "hf" / "config.json").read_text())["model_type"] for name in MODELS}
    assert found == set(ARCHITECTURES)


@pytest.mark.parametrize("name", MODELS)
def test_each_architecture_is_a_decoupled_python_model_over_its_checked_graph(built, name):
    from app.serve.tritonserver import left_to_auto_complete
    from scripts.model_prep.triton_config import read_config

    folder = built[1] / name
    config = read_config(folder / "config.pbtxt")
    assert "\nmax_batch_size: 0\n" in (folder / "config.pbtxt").read_text()  # said, not left to Triton
    assert name not in left_to_auto_complete(built[1])
    assert config.backend == "python" and config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled and not config.HasField("dynamic_batching")
    assert [i.name for i in config.input] == [t["name"] for t in inputs()]
    assert [i.name for i in config.input][1 : 1 + len(SETTING_NAMES)] == list(SETTING_NAMES)
    assert [o.name for o in config.output] == [t["name"] for t in outputs()]
    assert config.parameters["ort_providers"].string_value == "CPUExecutionProvider"
    # one instance (its requests join one running batch), its threads sized by serve
    assert config.parameters["sizing"].string_value == "threads" and config.instance_group[0].count == 1
    assert sorted(p.name for p in (folder / "1").iterdir()) == [GRAPH_FILE, "model.py"]
    source = json.loads((folder / "source.json").read_text())
    assert source["weights"] == "file" and source["tuning"]["max_batch_size"] == 0
    # ONNX Runtime against torch at a later step and at the prompt's step, logits and keys/values
    assert len(source["max_abs_diff"]) == 4, source["max_abs_diff"]
    for check, diff in source["max_abs_diff"].items():
        assert 0 <= diff <= source["tolerance"][check] < 2e-3, check


@pytest.mark.parametrize("name", [name for name in MODELS if name.endswith("_trained")])
def test_each_trained_model_continues_its_sentences_over_the_served_graph(built, name):
    """Greedy over the repository's decoder.onnx (ONNX Runtime, the cache carried between steps)
    from a sentence's first words: the rest of that sentence, then its end, as ``generate`` answers."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clients.families import load_spec
    from scripts.model_prep import causal_lm_export

    spec = load_spec(built[0] / name)
    model = AutoModelForCausalLM.from_pretrained(spec.text.folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(spec.text.folder)
    session = ort.InferenceSession(str(built[1] / name / "1" / GRAPH_FILE))
    starts = ["The quick brown fox", "Tokyo is the capital"]
    tokenizer.padding_side = "left"
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token  # GPT-2 has none
    batch = tokenizer(starts, return_tensors="pt", padding=True)
    ends, pad = causal_lm_export.end_ids(spec, model)
    with torch.no_grad():
        tokens = causal_lm_export.greedy_over_graph(
            spec, model, session, batch.input_ids, batch.attention_mask, ends, pad, 30
        )
        for start, row in zip(starts, tokens):
            ids = tokenizer(start, return_tensors="pt").input_ids
            alone = model.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=pad)
            assert row == alone[0, ids.shape[1] :].tolist()
    # decoded with the prompt: a SentencePiece decoder drops the space before a text's first word
    texts = [
        tokenizer.decode(tokenizer(start).input_ids + row, skip_special_tokens=True)
        for start, row in zip(starts, tokens)
    ]
    assert texts == [next(s for s in SENTENCES if s.startswith(start)) for start in starts]
    assert all(row[-1] == tokenizer.eos_token_id for row in tokens)


def test_the_tokenizers_chat_templates_and_split_characters(built):
    """ChatML on Qwen, Llama 2's on Llama, none on GPT-2; the SentencePiece tokenizers take a character
    they have no piece for as its UTF-8 bytes, so one token may decode to part of a character."""
    from transformers import AutoTokenizer

    def tokenizer(name):
        return AutoTokenizer.from_pretrained(built[0] / name / "hf")

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    qwen = tokenizer("qwen2_random").apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert qwen == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    llama = tokenizer("llama_random").apply_chat_template(chat, tokenize=False)
    assert llama == "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"
    assert tokenizer("gpt2_random").chat_template is None
    served = AutoTokenizer.from_pretrained(built[1] / "qwen2_random" / "hf")  # the repository's copy (no weights)
    assert served.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == qwen
    text = "Tokyo is the capital of 日本 🍰 über"
    for name in ("gpt2_random", "qwen3_random", "llama_random", "mistral_random", "phi3_random"):
        found = tokenizer(name)
        ids = found(text, add_special_tokens=False).input_ids
        assert found.decode(ids) == text, name
        assert any("\ufffd" in found.decode([i]) for i in ids), name  # a token that is part of a character
    llama = tokenizer("llama_random")
    assert llama.convert_ids_to_tokens(llama("日", add_special_tokens=False).input_ids)[-3:] == [
        "<0xE6>",
        "<0x97>",
        "<0xA5>",
    ]
    assert llama("Hi").input_ids[0] == llama.bos_token_id


def test_a_second_preparation_reads_the_cache_and_a_gpu_target_gets_its_providers(
    built, small_models, tmp_path, capsys
):
    from scripts.model_prep.triton_config import read_config

    models = some_models(built[0], tmp_path / "models", "llama_random")
    extra = ("--target", "tensorrt", "--config-only", "--max-batch-size", "8")
    repository = prepare_text_repository(models, tmp_path / "repository", *extra, cache=small_models.cache)
    out = capsys.readouterr().out
    assert "[llama_random] ONNX export (weights from" in out and ") from the cache: " in out, out
    config = read_config(repository / "llama_random" / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size == 0 and config.model_transaction_policy.decoupled
    assert config.parameters["ort_providers"].string_value.split(",")[0] == "TensorrtExecutionProvider"
    assert sorted(p.name for p in (repository / "llama_random" / "1").iterdir()) == ["model.py"]


def test_the_sizing_plan_counts_each_model_as_a_cpu_network_and_keeps_it_decoupled(built):
    from app.core.machine import INSTANCE_TYPES
    from app.serve.sizing_plan import plan_for
    from clients import sized_configs
    from scripts.model_prep.triton_config import parse

    for instance_type, target in (("ml.g5.2xlarge", "tensorrt"), ("ml.c5.4xlarge", None)):
        plan = plan_for(INSTANCE_TYPES[instance_type], built[1], target)
        assert {part.triton_name for part in plan.parts} == set(MODELS), instance_type
        for name in MODELS:
            part = plan.part(name)
            assert part.count == 1 and not part.on_gpu and part.cpu == part.threads >= 1, part
    found = sized_configs.read(built[1] / "llama_random" / "config.pbtxt", INSTANCE_TYPES["ml.c5.4xlarge"])
    text = sized_configs.sized_text(found.config, plan.part("llama_random"))
    sized = parse(text)
    assert sized.model_transaction_policy.decoupled and sized.max_batch_size == 0 and "max_batch_size: 0" in text


def test_an_encoder_decoder_is_refused_by_the_family(small_models, tmp_path, capsys):
    models = tmp_path / "models"
    shutil.copytree(small_models.models("text2text") / "t5_random", models / "t5_lm")
    write_model_toml(models / "t5_lm", "text_generation")
    line = refused(tmp_path, capsys, models)
    assert "t5_lm" in line and "is an encoder-decoder" in line and 'family = "text2text_generation"' in line, line


def test_a_batch_size_is_refused(built, tmp_path):
    from clients.families import load_spec

    model = some_models(built[0], tmp_path, "gpt2_random") / "gpt2_random"
    (model / "model.toml").write_text('family = "text_generation"\nmax_batch_size = 4\n[export]\ntransformers = "hf"\n')
    with pytest.raises(SpecError, match="max_batch_size must be 0 for text_generation"):
        load_spec(model)


def other_architecture(built, models: Path, model_type: str, **settings) -> Path:
    """``models/<model_type>``: a tiny model of another architecture with the set's Llama tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = models / model_type / "hf"
    shutil.copytree(
        built[0] / "llama_random" / "hf", hf, ignore=shutil.ignore_patterns("*.safetensors", "*config.json")
    )
    shutil.copy(built[0] / "llama_random" / "hf" / "tokenizer_config.json", hf)
    sizes = dict(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, **settings)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **sizes)).save_pretrained(hf)
    write_model_toml(models / model_type, "text_generation")
    return models


def test_an_architecture_outside_the_served_ones_is_tried_and_refused_in_one_line(built, tmp_path, capsys):
    """BLOOM's positions are ALiBi's: its graph has no position_ids, so it is not the contract's."""
    models = other_architecture(built, tmp_path / "models", "bloom", bos_token_id=1, eos_token_id=2)
    line = refused(tmp_path, capsys, models)
    assert line.startswith("prepare_models: error: [bloom] ") and str(models / "bloom" / "hf") in line, line
    assert "model_type 'bloom'" in line and "it has no position_ids" in line, line
    assert line.endswith("text_generation serves " + ", ".join(ARCHITECTURES)), line


def test_a_folder_whose_modeling_code_is_its_own_is_refused(built, tmp_path, capsys):
    model = some_models(built[0], tmp_path / "models", "llama_random") / "llama_random"
    config = {"model_type": "my_lm", "auto_map": {"AutoModelForCausalLM": "modeling_my_lm.MyLM"}, "vocab_size": 500}
    (model / "hf" / "config.json").write_text(json.dumps(config))
    line = refused(tmp_path, capsys, tmp_path / "models")
    assert "model_type 'my_lm'" in line and "trust_remote_code" in line, line


@pytest.mark.parametrize("broken", ["tokens", "tolerance"])
def test_a_check_that_fails_stops_preparation_in_one_line(built, tmp_path, capsys, monkeypatch, broken):
    from scripts.model_prep import causal_lm_export
    from scripts.model_prep.recipes import Tolerance

    if broken == "tokens":
        monkeypatch.setattr(causal_lm_export, "greedy_over_graph", lambda *_: [[7], [7]])
    else:
        monkeypatch.setattr(causal_lm_export, "TOLERANCE", Tolerance(atol=-1.0, rtol=0.0))  # no difference meets it
    line = refused(tmp_path, capsys, some_models(built[0], tmp_path / "models", "qwen2_random"))
    assert "[qwen2_random]" in line and "model_type 'qwen2'" in line and "serves" not in line, line
    if broken == "tokens":
        assert "its export does not equal generate (tokens [[7], [7]] against [[" in line, line
    else:
        assert "ONNX Runtime differs from torch beyond the tolerance: logits (past 3)" in line, line
    assert not (tmp_path / "repository" / "qwen2_random").exists()


def test_the_family_s_triton_model_missing_is_said(built, tmp_path, monkeypatch):
    import app.triton
    from scripts.model_prep import causal_lm_export
    from scripts.model_prep.onnx_export import ExportError

    monkeypatch.setattr(app.triton, "CAUSAL_LM_MODEL", tmp_path / "causal_lm_model.py")
    with pytest.raises(ExportError, match="causal_lm_model.py is missing"):
        causal_lm_export.write_version(tmp_path / "1", tmp_path, shutil.copyfile)


def test_a_graph_whose_weights_lie_beside_it_keeps_them_in_one_file(built, tmp_path, monkeypatch):
    """A graph over protobuf's 2 GB comes out of the exporter with a file per weight beside it: they
    become one file, decoder.onnx.data, which ONNX Runtime reads and the version folder links."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    import app.triton
    from scripts.model_prep import causal_lm_export

    graph = built[1] / "llama_random" / "1" / GRAPH_FILE
    partial = tmp_path / "partial"
    partial.mkdir()
    onnx.save_model(
        onnx.load(str(graph)),
        str(partial / GRAPH_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
    )
    assert len(list(partial.iterdir())) > 10
    causal_lm_export.one_data_file(partial / GRAPH_FILE)
    assert sorted(p.name for p in partial.iterdir()) == [GRAPH_FILE, causal_lm_export.DATA_FILE]
    assert causal_lm_export.graph_files(partial) == [GRAPH_FILE, causal_lm_export.DATA_FILE]
    session, reference = (ort.InferenceSession(str(p)) for p in (partial / GRAPH_FILE, graph))
    # the prompt's step: three tokens, no past, the logits of its position 1 (ones)
    axes = {"batch": 2, "new": 3, "total": 3, "past": 0, "kept": 1}
    feed = {
        i.name: np.ones([axes.get(d, d) for d in i.shape], dtype=np.int64 if "int64" in i.type else np.float32)
        for i in session.get_inputs()
    }
    assert all(np.array_equal(a, b) for a, b in zip(session.run(None, feed), reference.run(None, feed)))
    monkeypatch.setattr(app.triton, "CAUSAL_LM_MODEL", tmp_path / "model.py")
    (tmp_path / "model.py").write_text("")
    causal_lm_export.write_version(tmp_path / "1", partial, shutil.copyfile)
    assert sorted(p.name for p in (tmp_path / "1").iterdir()) == [GRAPH_FILE, causal_lm_export.DATA_FILE, "model.py"]
