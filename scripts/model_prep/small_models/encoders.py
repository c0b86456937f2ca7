"""Small Hugging Face encoder folders: text classifiers, token classifiers, sentence-transformers
encoders and masked LMs of each tokenizer kind, built offline in seconds.

Each folder is what ``save_pretrained`` writes (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``), with seeded random weights of a tiny architecture
(two layers of width 32) and a tokenizer trained here on a small corpus with the ``tokenizers``
library: WordPiece (BERT: it takes ``token_type_ids``), byte-level BPE (RoBERTa) or
SentencePiece/Unigram (XLM-RoBERTa). ``sentence_transformers_folder`` adds what
sentence-transformers reads (``modules.json``, ``1_Pooling/config.json``, ``Normalize``).
``model_folder`` writes the two-line ``model.toml`` beside it. Nothing here downloads anything.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

CORPUS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "A woman is playing the violin.",
    "John Smith lives in Berlin and works for Acme Corporation.",
    "Angela Merkel visited Paris, London and New York last week.",
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "Hugging Face pipelines tokenize, run the network and post-process.",
    "Sentence embeddings map texts of similar meaning close together.",
    "Unbelievably, the transformers restructured their tokenization strategies!",
    "Ünïcödé wörds, émojis 🙂 and numbers like 12345 or 3.14159 appear too.",
]
NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
SENTIMENT_LABELS = ("NEGATIVE", "POSITIVE")
KINDS = ("bert", "roberta", "xlm-roberta")
HEADS = ("sequence", "token", "base", "masked")
MAX_POSITIONS = 64  # the sequence limit of the small models: long texts are cheap to make


def corpus(repeat: int = 20) -> list[str]:
    """The tokenizers' training texts: the corpus ``repeat`` times."""
    return [line for _ in range(repeat) for line in CORPUS]


def wordpiece_tokenizer(lowercase: bool = True):
    """BertTokenizerFast with a WordPiece vocabulary trained on the corpus."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    trainer = BertWordPieceTokenizer(lowercase=lowercase)
    trainer.train_from_iterator(corpus(), vocab_size=300, min_frequency=1, show_progress=False)
    vocab = dict(sorted(trainer.get_vocab().items(), key=lambda item: item[1]))
    return BertTokenizerFast(vocab=vocab, do_lower_case=lowercase, model_max_length=MAX_POSITIONS)


def byte_level_bpe_tokenizer(tokenizer_class=None):
    """RobertaTokenizerFast (or ``tokenizer_class``: BART's) with a byte-level BPE (vocabulary and
    merges) trained on the corpus: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    tokenizer_class = tokenizer_class or RobertaTokenizerFast
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(corpus(), vocab_size=400, min_frequency=1, special_tokens=specials, show_progress=False)
    model = json.loads(trainer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return tokenizer_class(vocab=model["vocab"], merges=merges, model_max_length=MAX_POSITIONS)


def unigram_tokenizer():
    """XLMRobertaTokenizerFast with a SentencePiece Unigram vocabulary trained on the corpus."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import XLMRobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = SentencePieceUnigramTokenizer()
    trainer.train_from_iterator(
        corpus(), vocab_size=200, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    vocab = [tuple(piece) for piece in json.loads(trainer.to_str())["model"]["vocab"]]
    vocab.append(("<mask>", 0.0))
    return XLMRobertaTokenizerFast(vocab=vocab, model_max_length=MAX_POSITIONS)


def _config(kind: str, tokenizer, **extra):
    from transformers import BertConfig, RobertaConfig, XLMRobertaConfig

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **extra)
    vocab_size = len(tokenizer)
    if kind == "bert":
        return BertConfig(vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2, **sizes)
    config_class = RobertaConfig if kind == "roberta" else XLMRobertaConfig
    # RoBERTa's positions start after the padding index: two more embeddings than usable positions
    return config_class(
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS + 2,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sizes,
    )


def tokenizer_of(kind: str):
    return {"bert": wordpiece_tokenizer, "roberta": byte_level_bpe_tokenizer, "xlm-roberta": unigram_tokenizer}[kind]()


def hf_folder(
    folder: Path,
    kind: str = "bert",
    head: str = "sequence",
    labels: tuple[str, ...] = SENTIMENT_LABELS,
    problem_type: str | None = None,
    seed: int = 0,
    weights: bool = True,
) -> Path:
    """A ``save_pretrained`` folder: a tiny ``kind`` model with the ``head`` (sequence or token
    classification, the bare encoder, masked LM) and seeded random weights (none with ``weights=False``:
    config and tokenizer only)."""
    import torch
    from transformers import (
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    tokenizer = tokenizer_of(kind)
    extra = {}
    if head in ("sequence", "token"):
        extra = {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}
        if problem_type:
            extra["problem_type"] = problem_type
    config = _config(kind, tokenizer, **extra)
    auto = {
        "sequence": AutoModelForSequenceClassification,
        "token": AutoModelForTokenClassification,
        "base": AutoModel,
        "masked": AutoModelForMaskedLM,
    }[head]
    torch.manual_seed(seed)
    model = auto.from_config(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    if weights:
        model.save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "lasttoken": "pooling_mode_lasttoken",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
}


def sentence_transformers_folder(
    folder: Path,
    kind: str = "bert",
    pooling: str = "mean",
    normalize: bool = True,
    max_seq_length: int = 48,
    seed: int = 0,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """A sentence-transformers folder (Transformer, Pooling and, with ``normalize``, Normalize) of a
    tiny ``kind`` encoder, in the layout ``SentenceTransformer(folder)`` loads; with ``prompts``, its
    config_sentence_transformers.json names them (and ``default_prompt_name``)."""
    hf_folder(folder, kind, head="base", seed=seed)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )
    (folder / "1_Pooling").mkdir(exist_ok=True)
    flags = {key: mode == pooling for mode, key in POOLING_KEYS.items()}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags}, indent=2))
    if prompts:
        settings = {"prompts": prompts, "default_prompt_name": default_prompt_name}
        (folder / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2))
    return folder


def write_model_toml(model: Path, family: str, source: str = "hf", extra: str = "") -> Path:
    """The two-line model.toml of a text family (``extra``: more TOML appended)."""
    model.mkdir(parents=True, exist_ok=True)
    (model / "model.toml").write_text(f'family = "{family}"\n[export]\ntransformers = "{source}"\n{extra}')
    return model / "model.toml"


def update_json_files(folder: Path, files: dict[str, dict[str, Any]] | None) -> None:
    """Set keys in the folder's JSON files (``files``: a file's name and the keys to set in it), as a
    user's edit of ``tokenizer_config.json`` or ``generation_config.json`` would."""
    for name, values in (files or {}).items():
        path = folder / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **values}, indent=2))


def model_folder(
    models: Path,
    name: str,
    family: str,
    head: str = "",
    extra: str = "",
    files: dict[str, dict[str, Any]] | None = None,
    **options,
) -> Path:
    """``models/<name>/`` with its model.toml (``family``, and ``extra`` lines) and the Hugging Face
    folder ``hf/`` inside: ``hf_folder`` with ``head`` (``options``: kind, labels, problem_type, seed,
    weights), or without a head a sentence-transformers folder (``options``: pooling, normalize, ...);
    ``files``: keys set in the folder's JSON files afterwards (``update_json_files``)."""
    model = models / name
    if head:
        hf_folder(model / "hf", head=head, **options)
    else:
        sentence_transformers_folder(model / "hf", **options)
    update_json_files(model / "hf", files)
    write_model_toml(model, family, extra=extra)
    return model


# The encoder families' small models (each family's ``small``): (models, name, **options) -> the folder.
text_classification_folder = partial(model_folder, family="text_classification", head="sequence")
token_classification_folder = partial(model_folder, family="token_classification", head="token")
fill_mask_folder = partial(model_folder, family="fill_mask", head="masked")
sentence_embedding_folder = partial(model_folder, family="sentence_embedding")
