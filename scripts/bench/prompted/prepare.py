"""The prompted benchmark's models and repository, prepared by ``scripts.model_prep`` in this process.

Realistic (the default): the architectures at their real sizes from the default configs, seeded random
weights, nothing downloaded:

- ``bench_sam``: ``SamConfig()``, sam-vit-base (a ViT-B image encoder on 1024-pixel inputs), its
  weights drawn by ``sam_export.randomise`` (the config's own initialisation is near zero), and
  ``SamProcessor``'s defaults;
- ``bench_samhq``: ``SamHQConfig()``, sam-hq-vit-base's shape (the same ViT-B, its HQ decoder reading
  the first global layer's 768 channels), weights and processor as ``bench_sam``'s;
- ``bench_owlv2``: owlv2-base-patch16-ensemble's shape (``Owlv2Config`` with a ViT-B/16 on 960-pixel
  inputs: 3,600 boxes; CLIP's text encoder with its 49,408-row embedding, 16 positions), the tiny CLIP
  BPE of the small models (OWL pools the text at the largest id, its end token);
- ``bench_gdino``: Grounding DINO tiny (``GroundingDinoConfig()``: a Swin-T backbone, BERT-base's text
  encoder, 900 queries, 6 encoder and 6 decoder layers; images resized to 800 x 1333 at most), the
  WordPiece vocabulary of the small models (BERT's ids where Grounding DINO reads them by number: 101,
  102, 1012, 1029) padded with unused tokens to BERT's 30,522.

Each folder is built once (``models/<name>/hf``, kept while its ``BUILD`` stamp matches), and model
preparation's ``--cache-dir`` keeps the ONNX exports of those bytes: a second run exports nothing.

``--small``: the tiny ``sam_tiny``, ``samhq_tiny``, ``owlv2_tiny`` and ``gdino_tiny`` of the small-model sets
(``scripts.model_prep.small_models.sets``, built once per content), copied from their repositories.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from scripts.bench import prepared
from scripts.bench.prompted.plan import BOXED, CHAIN, CHAIN_FAMILY, GDINO, MODELS, OWLV2, SAM, SAM_HQ, SMALL_MODELS
from scripts.bench.text.prepare import write_model_toml

SEED = 0
OWL_IMAGE, OWL_PATCH = 960, 16  # owlv2-base-patch16-ensemble's
BERT_VOCABULARY = 30_522


def sam_folder(folder: Path, hq: bool = False) -> Path:
    """sam-vit-base's shape (``hq``: sam-hq-vit-base's), random weights, the processor's defaults."""
    import transformers

    from scripts.model_prep.sam_export import random_model
    from scripts.model_prep.sam_graphs import KINDS

    kind, config = (KINDS[SAM_HQ], transformers.SamHQConfig()) if hq else (KINDS[SAM], transformers.SamConfig())
    model = random_model(kind, config, SEED)
    processor = kind.classes()[1](image_processor=transformers.SamImageProcessor())
    return saved(folder, model, processor)


def owlv2_folder(folder: Path) -> Path:
    import torch
    from transformers import CLIPTokenizer, Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor

    from scripts.model_prep.small_models.owl import END, START, TEXT_LENGTH, clip_vocabulary

    vocab, merges = clip_vocabulary(folder.parent / "vocabulary")
    tokenizer = CLIPTokenizer(
        vocab=str(vocab), merges=str(merges), bos_token=START, eos_token=END, unk_token=END, pad_token="!",
        model_max_length=TEXT_LENGTH,
    )  # fmt: skip
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    config = Owlv2Config(
        text_config={"max_position_embeddings": TEXT_LENGTH, **ids},
        vision_config={"image_size": OWL_IMAGE, "patch_size": OWL_PATCH},
    )
    torch.manual_seed(SEED)
    model = Owlv2ForObjectDetection(config).eval()
    size = {"height": OWL_IMAGE, "width": OWL_IMAGE}
    return saved(folder, model, Owlv2Processor(image_processor=Owlv2ImageProcessor(size=size), tokenizer=tokenizer))


def gdino_folder(folder: Path) -> Path:
    import torch
    from transformers import (
        BertTokenizerFast,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
    )

    from scripts.model_prep.small_models.gdino import TEXT_POSITIONS, bert_vocabulary, spread_scores

    vocabulary = bert_vocabulary()
    vocabulary |= {f"[unused{i}]": i for i in range(len(vocabulary), BERT_VOCABULARY)}
    tokenizer = BertTokenizerFast(vocab=vocabulary, do_lower_case=True, model_max_length=TEXT_POSITIONS)
    torch.manual_seed(SEED)
    model = GroundingDinoForObjectDetection(GroundingDinoConfig(disable_custom_kernels=True)).eval()
    spread_scores(model)
    processor = GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(), tokenizer=tokenizer)
    return saved(folder, model, processor)


def saved(folder: Path, model, processor) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


BUILDERS: dict[str, tuple[Callable[[Path], Path], str]] = {
    SAM: (sam_folder, "sam-vit-base (SamConfig()), random weights"),
    SAM_HQ: (lambda folder: sam_folder(folder, hq=True), "sam-hq-vit-base (SamHQConfig()), random weights"),
    OWLV2: (owlv2_folder, f"OWLv2 base/{OWL_PATCH} at {OWL_IMAGE} px, random weights"),
    GDINO: (gdino_folder, "Grounding DINO tiny (Swin-T), random weights, its scores spread"),
}


def served(families: Sequence[str]) -> list[str]:
    """The families whose models the repository holds (the chain's parts too: Grounding DINO and SAM)."""
    parts = [
        family
        for family in (SAM, SAM_HQ, OWLV2, GDINO)
        if family in families or (CHAIN in families and family in (SAM, GDINO))
    ]
    return parts + [CHAIN] * (CHAIN in families)


def chain_toml(detector: str, segmenter: str) -> str:
    """The chain's model.toml: three lines naming its parts, models of the same repository."""
    return f'family = "{CHAIN_FAMILY}"\ndetector = "{detector}"\nsegmenter = "{segmenter}"\n'


def prepare_chain(repository: Path, names: Mapping[str, str]) -> None:
    """The chain's model.toml beside its parts in ``repository``, prepared there in place (it has no
    graph of its own: its Triton model opens its parts')."""
    from scripts.model_prep import cli

    folder = repository / names[CHAIN]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.toml").write_text(chain_toml(names[GDINO], names[SAM]))
    argv = ["--source", str(repository), "--models", names[CHAIN]]
    if cli.main(argv) != 0:
        raise SystemExit(f"python -m scripts.model_prep {' '.join(argv)} failed (its error is above)")


def models_of(small: bool) -> dict[str, str]:
    return SMALL_MODELS if small else MODELS


def small_folders(families: Sequence[str]) -> dict[str, tuple[Path, Path]]:
    """The small-model sets' tiny models, by family: (the prepared model, its Hugging Face folder)."""
    from scripts.model_prep.small_models.sets import ensure

    built = ensure()
    chosen = {family: ("sam" if family in BOXED else "zsd", SMALL_MODELS[family]) for family in families}
    return {f: (built.repository(s) / name, built.models(s) / name / "hf") for f, (s, name) in chosen.items()}


def source(models: Path, family: str) -> Path:
    """``models/<name>`` with its model.toml and ``hf/`` folder, built unless its stamp matches."""
    from scripts.model_prep.small_models.owl import FAMILY as DETECTION
    from scripts.model_prep.small_models.sam import FAMILY as MASKS

    make, what = BUILDERS[family]
    model = models / MODELS[family]
    prepared.kept_or_built(model, json.dumps({"seed": SEED, "what": what}), what, make)
    write_model_toml(model, MASKS if family in BOXED else DETECTION)
    return model


def prepare(out: Path, repository: Path, families: Sequence[str], small: bool, build: bool) -> dict[str, Path]:
    """The repository holds the families' models and nothing else (unless ``build`` is False: served as
    it is); the Hugging Face folders of their references, by family (the chain's are its parts')."""
    chosen, names = served(families), models_of(small)
    parts = [family for family in chosen if family != CHAIN]  # the models with folders of their own
    if build:
        print(f"preparing {repository} ({'small' if small else 'realistic'} models: {', '.join(chosen)}) ...")
        repository.mkdir(parents=True, exist_ok=True)
        for stale in repository.iterdir():
            if stale.is_dir() and stale.name not in {names[family] for family in chosen}:
                shutil.rmtree(stale)
        for family, (model, _) in (small_folders(parts) if small else {}).items():
            shutil.rmtree(repository / SMALL_MODELS[family], ignore_errors=True)
            shutil.copytree(model, repository / SMALL_MODELS[family])
        for family in [] if small else parts:
            prepared.prepare_repository(
                out, repository, names[family], SEED, False, lambda models, _small, f=family: source(models, f)
            )
        if CHAIN in chosen:
            prepare_chain(repository, names)
    if small:
        return {family: folder for family, (_, folder) in small_folders(parts).items()}
    return {family: prepared.sources(out, False) / names[family] / "hf" for family in parts}
