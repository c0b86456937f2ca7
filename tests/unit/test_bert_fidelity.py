"""Issue check 3: the fill-mask client, running the built bert_base ONNX (ONNX Runtime standing in
for Triton), equals Hugging Face's ``FillMaskPipeline`` on the same weights: the build's seeded
random ``BertForMaskedLM`` (scripts/model_prep/recipes.py: the small network of the test repository, or
the full-size one), rebuilt here from the seed recorded in
the repository's source.json, with ``BertTokenizerFast`` on the model's own vocab.txt."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast, FillMaskPipeline

from app.core.settings import Settings
from clients.families import load_spec
from clients.fill_mask import VocabFillMaskClient
from scripts.devtools import built_test_repository
from scripts.model_prep.recipes import recipes
from tests.references import OnnxTriton

SENTENCES = [
    "The capital of France is [MASK].",
    "Paris is the [MASK] of France.",
    "The [MASK] sat on the [MASK].",
    "I can't believe it's [MASK]!",
    'She said, "don\'t [MASK] me" -- and left the [MASK].',
    "HELLO, World: naïve café [MASK] résumé?",
    "Numbers like 3.14 and 1,000,000 are [MASK] in 2024.",
    "The man worked as a [MASK].",
    "[MASK] is the best way to [MASK] a language.",
    "Tokenization of unbelievably long words: [MASK]ization.",
    "   spaces   and\ttabs\n[MASK]   ",
    "中文 [MASK] 字",
]
SCORE_ATOL = 1e-4


@pytest.fixture(scope="module")
def repository():
    return built_test_repository()


@pytest.fixture(scope="module")
def client(repository) -> VocabFillMaskClient:
    return VocabFillMaskClient(load_spec(repository / "bert_base"), OnnxTriton(repository), Settings())


@pytest.fixture(scope="module")
def pipeline(repository) -> FillMaskPipeline:
    source = json.loads((repository / "bert_base" / "source.json").read_text())
    assert source["weights"] in ("random", "small"), "these tests rebuild the build's random weights from its seed"
    recipe = recipes()[load_spec(repository / "bert_base").export["builder"]]
    torch.manual_seed(source["seed"])  # as scripts/model_prep/cli.py does before building the network
    build = recipe.small if source["weights"] == "small" else recipe.random
    model = build(load_spec(repository / "bert_base")).net.eval()  # the BertForMaskedLM inside the top-k wrapper
    # transformers 5 names the vocabulary argument ``vocab`` (a ``vocab_file=`` keyword is silently
    # ignored and gives an empty vocabulary): check that the file really was read.
    tokenizer = BertTokenizerFast(vocab=str(repository / "bert_base" / "vocab.txt"), do_lower_case=True)
    assert tokenizer.vocab_size == 30522 and tokenizer("[MASK]")["input_ids"] == [101, 103, 102]
    return FillMaskPipeline(model=model, tokenizer=tokenizer, device=-1)


def test_at_least_ten_sentences_some_with_two_masks():
    assert len(SENTENCES) >= 10 and sum(s.count("[MASK]") == 2 for s in SENTENCES) >= 3


def test_the_rebuilt_model_is_the_exported_one(client, pipeline):
    """The same weights: the exported graph's probabilities equal the rebuilt torch model's."""
    inputs, _ = client.preprocess(SENTENCES[0], "payload.text", {"topk": 5})
    batch = {name: array[None] for name, array in inputs.items()}
    outputs, _ = client.triton.infer("bert_base", batch, client.output_names)
    with torch.no_grad():
        logits = pipeline.model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits
    scores, ids = logits.softmax(-1).topk(outputs["scores"].shape[-1], dim=-1)
    np.testing.assert_allclose(outputs["scores"], scores.numpy(), rtol=0, atol=1e-6)
    assert np.array_equal(outputs["token_ids"][0, :, :5], ids.numpy()[0, :, :5])


@pytest.mark.parametrize("top_k", [5, 10])
def test_results_equal_fill_mask_pipeline(client, pipeline, top_k):
    ours, _ = client.inference({"text": SENTENCES, "topk": top_k})
    worst = 0.0
    for text, result in zip(SENTENCES, ours):
        expected = pipeline(text, top_k=top_k)
        masks = text.count("[MASK]")
        if masks == 1:
            expected, result = [expected], [result]
        assert len(result) == len(expected) == masks
        for our_row, their_row in zip(result, expected):
            assert [c["token"] for c in our_row] == [c["token"] for c in their_row], text
            assert [c["token_str"] for c in our_row] == [c["token_str"] for c in their_row], text
            assert [c["sequence"] for c in our_row] == [c["sequence"] for c in their_row], text
            diff = np.max(np.abs(np.array([c["score"] for c in our_row]) - [c["score"] for c in their_row]))
            assert diff <= SCORE_ATOL, text
            worst = max(worst, float(diff))
        first = result[0][0]
        print(
            f"{text!r}: {masks} mask(s), first {first['token']} {first['token_str']!r} "
            f"{first['score']:.6f} {first['sequence']!r}"
        )
    print(f"top_k {top_k}: {len(SENTENCES)} sentences, max |score diff| {worst:.2e} (tolerance {SCORE_ATOL})")
