"""The benchmark's model and repository, prepared by ``scripts.model_prep`` in this process.

Realistic (the default): ``bench_t5``, t5-small's architecture (``T5Config``: width 512,
feed-forward 2048, 6 encoder and 6 decoder layers, 8 heads of 64, 32 relative-position buckets) with
seeded random weights, and a SentencePiece Unigram tokenizer trained here on sentences of the text
benchmark's words, its vocabulary padded with dummy pieces (``▁zq<n>``, scored below every trained
piece: no text is cut into them, and a generated one decodes to its own string) up to t5-small's
32,128 entries, so that the language-model head, a ``512 x 32,128`` product each step of every
text, costs what t5-small's does. The ``<pad>`` row of the (tied) embedding is zero, as an
embedding with a padding index has it: with random tied embeddings each step's argmax is the token
fed in, and ``<pad>`` starts the decoder, so greedy search would answer ``<pad>`` forever (an empty
text); with the row zero the first step picks a piece by the text, which then repeats (each text its
own, decoded as ``zq<n> zq<n> ...``: what a random model writes costs what any text does). Random
weights never end a text early: every generation runs to ``max_new_tokens`` (the benchmark also
sets ``min_new_tokens`` to it).

The folder is built once (``models/bench_t5/hf``, kept while its ``BUILD`` stamp matches), and
model preparation's ``--cache-dir`` keeps the ONNX export of those bytes: a second run exports nothing.

``--small``: the tiny T5 of ``scripts.model_prep.small_models`` (two layers of width 32), a smoke run.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from app.core.spec import ModelSpec
from clients.text2text import FAMILY
from scripts.bench import prepared
from scripts.bench.generation.plan import MODEL
from scripts.bench.text.plan import WORDS
from scripts.bench.text.prepare import write_model_toml

SEED = 0
VOCABULARY = 32_128  # t5-small's embedding rows (its tokenizer's 32,100 pieces, padded)
SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's ids 0, 1, 2
CORPUS_SENTENCES, TRAINED_PIECES = 2000, 2000  # the trainer stops short of TRAINED_PIECES on so few words
DUMMY = "\u2581zq{}"  # a padding piece: "▁zq<n>"
ARCHITECTURE = {
    "d_model": 512,
    "d_ff": 2048,
    "d_kv": 64,
    "num_layers": 6,
    "num_decoder_layers": 6,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
    "dropout_rate": 0.0,
}
BUILD = json.dumps({"seed": SEED, "vocabulary": VOCABULARY, "corpus": CORPUS_SENTENCES, "pad_row": 0, **ARCHITECTURE})


def corpus(count: int = CORPUS_SENTENCES, seed: int = SEED) -> list[str]:
    """Seeded sentences of 4 to 16 of the text benchmark's words, a capital first and a full stop."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16)))
        sentences.append(words[0].upper() + words[1:] + ".")
    return sentences


def padded_vocabulary(trained: list[list], size: int = VOCABULARY) -> list[tuple[str, float]]:
    """The trained Unigram pieces in a reproducible order (the trainer is multithreaded: pieces of
    equal score come in any order; the specials keep their ids, the others follow by score, rounded,
    then by piece), then dummy pieces, each scored below every trained one, up to ``size`` entries."""
    specials = [(piece, score) for piece, score in trained if piece in SPECIALS]
    pieces = sorted(
        ((piece, round(score, 8)) for piece, score in trained if piece not in SPECIALS),
        key=lambda item: (-item[1], item[0]),
    )
    lowest = min((score for _, score in pieces), default=0.0) - 10.0
    chosen = specials + pieces
    return chosen + [(DUMMY.format(i), lowest) for i in range(size - len(chosen))]


def t5_tokenizer(size: int = VOCABULARY):
    """T5TokenizerFast on the padded Unigram vocabulary: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, no sentinels."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import T5TokenizerFast

    trainer = SentencePieceUnigramTokenizer()
    trainer.train_from_iterator(
        corpus(), vocab_size=TRAINED_PIECES, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False
    )
    vocabulary = padded_vocabulary(json.loads(trainer.to_str())["model"]["vocab"], size)
    return T5TokenizerFast(vocab=vocabulary, extra_ids=0, model_max_length=512)


def t5_small_folder(folder: Path) -> Path:
    """A ``save_pretrained`` folder of a t5-small-sized ``T5ForConditionalGeneration`` with seeded random
    weights (the ``<pad>`` row zero), greedy search by default (as t5-small's), and its tokenizer."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = t5_tokenizer()
    config = T5Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **ARCHITECTURE,
    )
    torch.manual_seed(SEED)
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.shared.weight[tokenizer.pad_token_id] = 0.0
    model.generation_config.num_beams, model.generation_config.do_sample = 1, False
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def model_source(models: Path, small: bool) -> Path:
    """``models/bench_t5`` with its model.toml and ``hf/`` folder, built unless already there."""
    model = models / MODEL
    if small:
        from scripts.model_prep.small_models.seq2seq import generation_model_folder

        if not (model / "model.toml").is_file():
            generation_model_folder(models, MODEL, kind="t5", seed=SEED)
        return model
    prepared.kept_or_built(
        model, BUILD, "t5-small's architecture, random weights, a padded Unigram tokenizer", t5_small_folder
    )
    write_model_toml(model, FAMILY.name)
    return model


def prepare_repository(out: Path, repository: Path, small: bool) -> Path:
    """The model's source in ``out/models`` (its ONNX export cached in ``out/cache``), prepared into ``repository``."""
    return prepared.prepare_repository(out, repository, MODEL, SEED, small, model_source)


def ready(out: Path, repository: Path, small: bool, build: bool) -> ModelSpec:
    """The served model's spec, its repository prepared first (unless ``build`` is False: served as it is)."""
    return prepared.ready(
        out, repository, MODEL, small, (lambda: prepare_repository(out, repository, small)) if build else None
    )
