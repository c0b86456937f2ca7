"""Small Hugging Face text2text (encoder-decoder) model folders: the generation family's small models.

Each folder is what ``save_pretrained`` writes (``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``) for a tiny T5 (relative
positions, SentencePiece/Unigram tokenizer, decoding starts at ``<pad>``) or BART (learned positions,
byte-level BPE tokenizer, decoding starts at ``</s>`` and emits ``<s>`` first) of two encoder and two
decoder layers of width 32, the tokenizer trained here on the corpus of ``encoders`` with the
``tokenizers`` library. The weights are seeded random, or with ``trained=True`` fitted in a few seconds
to a toy task (``headline_pairs``: the first three words of the input) so that greedy and beam search
give varied texts that end with ``</s>`` well before the default ``max_length``.
``generation_model_folder`` writes the two-line ``model.toml`` beside it. Nothing here downloads anything.
"""

from __future__ import annotations

import json
from pathlib import Path

from clients.text2text import Text2TextClient
from scripts.model_prep.small_models.encoders import (
    CORPUS,
    MAX_POSITIONS,
    byte_level_bpe_tokenizer,
    corpus,
    update_json_files,
    write_model_toml,
)

FAMILY = Text2TextClient.family
GENERATION_KINDS = ("t5", "bart")
HEADLINE_WORDS = 3  # the toy task's target: the input's first words (T5 spells four in up to 30 tokens)
TRAIN_STEPS = {"t5": 120, "bart": 100}  # full-batch Adam steps: ~55 ms (T5) and ~33 ms (BART) each on 2 cores
LEARNING_RATE = 1e-2
SPECIALS_T5 = ["<pad>", "</s>", "<unk>"]


def _canonical_unigram_vocab(vocab: list[list]) -> list[tuple[str, float]]:
    """The trained Unigram vocabulary in a reproducible order: the Unigram trainer is multithreaded, so
    pieces of equal score come in a different order from run to run (and scores differ in the last
    bits); the special tokens keep their ids, the others follow by score (rounded), then by piece."""
    specials = [(piece, score) for piece, score in vocab if piece in SPECIALS_T5]
    pieces = [(piece, round(score, 8)) for piece, score in vocab if piece not in SPECIALS_T5]
    return specials + sorted(pieces, key=lambda item: (-item[1], item[0]))


def t5_tokenizer():
    """T5TokenizerFast (no sentinel ``<extra_id_*>``) with a SentencePiece Unigram vocabulary trained on
    the corpus: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, no ``<s>``; it appends ``</s>`` to each text."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import T5TokenizerFast

    trainer = SentencePieceUnigramTokenizer()
    trainer.train_from_iterator(
        corpus(), vocab_size=200, special_tokens=SPECIALS_T5, unk_token="<unk>", show_progress=False
    )
    vocab = _canonical_unigram_vocab(json.loads(trainer.to_str())["model"]["vocab"])
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=MAX_POSITIONS)


def bart_tokenizer():
    """BartTokenizerFast with a byte-level BPE trained on the corpus (``encoders``'): ``<s>`` 0,
    ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4; it wraps each text in ``<s> ... </s>``."""
    from transformers import BartTokenizerFast

    return byte_level_bpe_tokenizer(BartTokenizerFast)


def _t5_config(tokenizer):
    from transformers import T5Config

    return T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )


def _bart_config(tokenizer):
    from transformers import BartConfig

    return BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,  # as facebook/bart-*: </s> starts, <s> comes first
        forced_bos_token_id=None,
    )


def headline_pairs() -> list[tuple[str, str]]:
    """The toy task: every tail of each corpus sentence (from each word on) and its first
    ``HEADLINE_WORDS`` words, e.g. ``"a horse."`` -> ``"a horse."``,
    ``"A man is riding a horse."`` -> ``"A man is"``."""
    pairs = {}
    for line in CORPUS:
        words = line.split()
        for start in range(len(words)):
            pairs[" ".join(words[start:])] = " ".join(words[start : start + HEADLINE_WORDS])
    return list(pairs.items())


def _train(model, tokenizer, steps: int, seed: int) -> None:
    """Full-batch Adam on ``headline_pairs`` (padding left out of the loss), in place; ends in eval mode."""
    import torch

    sources, targets = zip(*headline_pairs())
    batch = tokenizer(list(sources), padding=True, truncation=True, return_tensors="pt")
    labels = tokenizer(list(targets), padding=True, return_tensors="pt")
    batch["labels"] = labels.input_ids.masked_fill(labels.attention_mask == 0, -100)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    model.eval()


def _folder(folder: Path, kind: str, seed: int, trained: bool) -> Path:
    import torch
    from transformers import BartForConditionalGeneration, T5ForConditionalGeneration

    tokenizer = t5_tokenizer() if kind == "t5" else bart_tokenizer()
    config = _t5_config(tokenizer) if kind == "t5" else _bart_config(tokenizer)
    model_class = T5ForConditionalGeneration if kind == "t5" else BartForConditionalGeneration
    torch.manual_seed(seed)
    model = model_class(config).eval()
    if trained:
        # One thread: the same weights on every machine, and no stall where the suite's processes
        # share the cores (torch's threads wait for each other by spinning: 150 steps took minutes)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            _train(model, tokenizer, TRAIN_STEPS[kind], seed)
        finally:
            torch.set_num_threads(threads)
    generation = model.generation_config
    generation.num_beams = 1
    generation.do_sample = False
    generation.max_new_tokens = None
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def t5_folder(folder: Path, seed: int = 0, trained: bool = False) -> Path:
    """A ``save_pretrained`` folder of a tiny ``T5ForConditionalGeneration`` and its Unigram tokenizer:
    seeded random weights, or with ``trained`` fitted to ``headline_pairs``."""
    return _folder(folder, "t5", seed, trained)


def bart_folder(folder: Path, seed: int = 0, trained: bool = False) -> Path:
    """A ``save_pretrained`` folder of a tiny ``BartForConditionalGeneration`` and its byte-level BPE
    tokenizer: seeded random weights, or with ``trained`` fitted to ``headline_pairs``."""
    return _folder(folder, "bart", seed, trained)


def generation_model_folder(
    models: Path,
    name: str,
    kind: str = "t5",
    trained: bool = False,
    seed: int = 0,
    extra: str = "",
    files: dict[str, dict] | None = None,
) -> Path:
    """``models/<name>/`` with its model.toml (family text2text_generation; ``extra``: more TOML) and the
    Hugging Face folder ``hf/`` of a tiny ``kind`` (t5 or bart) model inside; ``files``: keys set in
    the folder's JSON files afterwards (``generation_config.json``'s defaults, say)."""
    model = models / name
    {"t5": t5_folder, "bart": bart_folder}[kind](model / "hf", seed=seed, trained=trained)
    update_json_files(model / "hf", files)
    write_model_toml(model, FAMILY, extra=extra)
    return model
