"""The fill_mask family from a Hugging Face folder against ``pipeline("fill-mask")``, in one process:
a small random-weight masked LM of each tokenizer kind (WordPiece ``[MASK]``, byte-level BPE and
Unigram ``<mask>``) with its two-line model.toml, the "fill_mask" set of scripts.model_prep.small_models
(built once per run, prepared by ``python -m scripts.model_prep``), served by its client, ONNX Runtime
standing in for Triton.

Each folder cleans up spaces its own way, as transformers' ``decode`` reads ``tokenizer_config.json``:
not at all (the default: the BERT folder), ``clean_up_tokenization_spaces`` ignored for a BPE
tokenizer (RoBERTa), and applied (XLM-RoBERTa).

Tolerances: scores within 1e-4 of the pipeline's (FP32, ONNX Runtime against torch); tokens,
``token_str`` and ``sequence`` exactly equal. The bert_base model (a vocab.txt, fixed length) has
its own tests: test_bert_client.py and test_bert_fidelity.py."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import InvalidInput
from app.core.settings import Settings
from app.core.spec import SpecError
from clients.families import load_spec, make_client
from clients.fill_mask import FolderFillMaskClient
from scripts.model_prep.small_models.encoders import CORPUS
from scripts.model_prep.small_models.sets import SETS, Built
from tests.references import OnnxTriton, in_process_clients

ATOL = 1e-4
# name: (tokenizer kind, tokenizer_config.json's clean_up_tokenization_spaces)
MODELS = {
    name: (options["kind"], options["files"]["tokenizer_config.json"]["clean_up_tokenization_spaces"])
    for name, (_, options) in SETS["fill_mask"].models.items()
}
ONE_MASK = [
    "A man is eating {mask}.",
    "The quick brown {mask} jumps over the lazy dog near the riverbank.",
    "{mask}",
    "  Ünïcödé wörds, émojis 🙂 and {mask} like 12345 or 3.14159 appear too !  ",
    "John Smith lives in {mask} , and isn't working for Acme .",
    "{mask} , {pad} and {cls} too",
]
TWO_MASKS = [
    "A {mask} is riding a {mask}.",
    "{mask}{mask}",
    "Angela Merkel visited {mask} , London and {mask} last week .",
    # special tokens in the text: kept in the sequence (several masks), except padding, as in the pipeline
    "{cls} {mask} , {pad} and {mask} too",
]
LONG_TEXT = " ".join(CORPUS * 3) + " {mask}"  # about 200 tokens: past the small models' 64


@pytest.fixture(scope="module")
def built(small_models: Built) -> tuple[Path, Path]:
    return small_models.models("fill_mask"), small_models.repository("fill_mask")


@pytest.fixture(scope="module")
def triton(built) -> OnnxTriton:
    return OnnxTriton(built[1])


@pytest.fixture(scope="module")
def clients(built, triton):
    return in_process_clients(built[1], triton)


@pytest.fixture(scope="module")
def references(built):
    from transformers import pipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: pipeline("fill-mask", model=str(built[0] / name / "hf")) for name in MODELS}


def texts_of(client, templates: list[str]) -> list[str]:
    """The templates with the model's own mask, padding and first special token (``[CLS]``, ``<s>``)."""
    tokenizer = client.tokenizer
    first = tokenizer.id_to_token(tokenizer.encode("").ids[0])
    pad = tokenizer.id_to_token(client.pad_token_id)
    return [template.format(mask=client.mask_token, pad=pad, cls=first) for template in templates]


def assert_candidates(ours: list, theirs: list) -> None:
    for key in ("token", "token_str", "sequence"):
        assert [c[key] for c in ours] == [c[key] for c in theirs], key
    np.testing.assert_allclose([c["score"] for c in ours], [c["score"] for c in theirs], rtol=0, atol=ATOL)


def test_two_lines_give_the_model(clients):
    for name, (kind, _) in MODELS.items():
        client = clients[name]
        assert isinstance(client, FolderFillMaskClient)
        assert client.mask_token == ("[MASK]" if kind == "bert" else "<mask>")
        assert [(t.name, t.dtype, list(t.dims)) for t in client.spec.outputs] == [
            ("scores", "FP32", [-1, 50]),
            ("token_ids", "INT64", [-1, 50]),
        ]
        inputs = [t.name for t in client.spec.inputs]
        assert inputs == ["input_ids", "attention_mask"] + (["token_type_ids"] if kind == "bert" else [])
        assert client.sequence_length == 64 and client.options["topk"].maximum == 50
    assert [clients[name].clean_up for name in MODELS] == [False, False, True]  # RoBERTa's: BPE, ignored


@pytest.mark.parametrize("top_k", [1, 5])
@pytest.mark.parametrize("name", MODELS)
def test_one_mask_equals_the_pipeline(clients, references, name, top_k):
    texts = texts_of(clients[name], ONE_MASK)
    ours, _ = clients[name].inference({"text": texts, "topk": top_k})
    assert len(ours) == len(texts)
    for text, answer in zip(texts, ours):
        theirs = references[name](text, top_k=top_k)
        assert isinstance(answer, list) and len(answer) == top_k and isinstance(answer[0], dict)
        assert_candidates(answer, theirs)
    one, _ = clients[name].inference({"text": texts[0], "topk": top_k})
    assert one == ours[0]


@pytest.mark.parametrize("top_k", [1, 5])
@pytest.mark.parametrize("name", MODELS)
def test_two_masks_equal_the_pipeline_a_list_per_mask(clients, references, name, top_k):
    texts = texts_of(clients[name], TWO_MASKS)
    ours, _ = clients[name].inference({"text": texts, "topk": top_k})
    for text, answer in zip(texts, ours):
        theirs = references[name](text, top_k=top_k)
        assert len(answer) == len(theirs) == 2 and all(len(row) == top_k for row in answer)
        for our_row, their_row in zip(answer, theirs):
            assert_candidates(our_row, their_row)
    one, _ = clients[name].inference({"text": texts[0], "topk": top_k})
    assert one == ours[0]


@pytest.mark.parametrize("name", MODELS)
def test_a_list_mixing_one_and_two_masks_nests_as_the_pipeline(clients, references, name):
    texts = texts_of(clients[name], [ONE_MASK[0], TWO_MASKS[0], ONE_MASK[1]])
    ours, _ = clients[name].inference({"text": texts})  # the default top_k: 5, as the pipeline's
    theirs = references[name](texts)
    assert [len(answer) for answer in ours] == [len(answer) for answer in theirs] == [5, 2, 5]
    for masks, answer, expected in zip([1, 2, 1], ours, theirs):
        rows = [(answer, expected)] if masks == 1 else zip(answer, expected)
        for our_row, their_row in rows:
            assert_candidates(our_row, their_row)


@pytest.mark.parametrize("ragged", [False, True])
def test_texts_are_padded_to_their_bucket_or_their_longest(clients, triton, monkeypatch, ragged):
    """To a bucket where Triton batches only requests of one length; to the longest text on the python
    target, whose config allows ragged batches."""
    client = clients["fill_roberta"]
    assert client.ragged  # prepared for the python target
    monkeypatch.setattr(client, "ragged", ragged)
    short, longer = texts_of(client, ["{mask}.", "A man is eating {mask}. " * 3])
    assert [len(client.tokenizer.encode(text).ids) for text in (short, longer)] == [4, 26]
    triton.calls.clear()
    client.inference({"text": short})
    client.inference({"text": [short, longer]})
    assert [shapes["input_ids"] for _, shapes in triton.calls] == ([(1, 4), (2, 26)] if ragged else [(1, 16), (2, 32)])


@pytest.mark.parametrize(
    ("payload", "fragments"),
    [
        ({"text": "nothing to fill"}, ["payload.text has no <mask>"]),
        ({"text": ["a <mask>", "nothing"]}, ["payload.text[1] has no <mask>"]),
        ({"text": 7}, ["payload.text", "must be a string"]),
        ({"text": ["a <mask>", None]}, ["payload.text[1]", "must be a string"]),
        ({"text": ["a <mask>", LONG_TEXT.format(mask="<mask>")]}, ["payload.text[1] is", "tokens", "limit of 64"]),
        ({"text": "a <mask>", "topk": 51}, ["payload.topk", "between 1 and 50"]),
        ({"text": "a <mask>", "truncation": True}, ["payload.truncation", "not an option"]),
    ],
)
def test_bad_input_is_refused_naming_the_field(clients, payload, fragments):
    with pytest.raises(InvalidInput) as refused:
        clients["fill_roberta"].inference(payload)
    for fragment in fragments:
        assert fragment in refused.value.message, refused.value.message


def test_a_tokenizer_without_a_mask_token_is_refused_at_start(built, tmp_path):
    model = shutil.copytree(built[1] / "fill_roberta", tmp_path / "fill_roberta", ignore=shutil.ignore_patterns("1"))
    config_path = model / "hf" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["mask_token"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(SpecError, match="mask_token names none"):
        make_client(load_spec(model), OnnxTriton(tmp_path), Settings())


def test_max_topk_sets_the_candidates_up_to_the_vocabulary(built, tmp_path):
    model = shutil.copytree(built[0] / "fill_xlmr", tmp_path / "fill_xlmr")
    (model / "model.toml").write_text((model / "model.toml").read_text() + "[postprocess]\nmax_topk = 7\n")
    assert [list(t.dims) for t in load_spec(model).outputs] == [[-1, 7], [-1, 7]]
    (model / "model.toml").write_text((model / "model.toml").read_text().replace("= 7", "= 100000"))
    with pytest.raises(SpecError, match="max_topk 100000 is more than the vocabulary's"):
        load_spec(model)
