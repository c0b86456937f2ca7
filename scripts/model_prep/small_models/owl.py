"""Small OWLv2 and OWL-ViT folders: the zero_shot_object_detection family's small models.

Each folder is what ``save_pretrained`` writes for a detector and its processor of a tiny config (a
text encoder of width 32 and two layers on 16 tokens; a vision encoder of width 48 and two layers on
64-pixel inputs in 8-pixel patches: 64 boxes) with seeded random weights, and the two-line
``model.toml`` beside it. The tokenizer is CLIP's byte-level BPE over a vocabulary of the 256 bytes,
the bytes ending a word, a few merged words and the start and end tokens, the end token last: OWL's
text pooling takes the position of the largest id, as on CLIP's own vocabulary (49407 is its end
token). Nothing here downloads anything.

Random weights give boxes that all saturate to the image's corners and scores around 0.5; the box
head's last layer is scaled down (x0.007) and the class head's shift and scale drawn again from the
seed, so that boxes have shapes and scores spread from 0 to 1 (a quarter of them over 0.1).
"""

from __future__ import annotations

import json
from pathlib import Path

from clients.zero_shot_detection import ZeroShotDetectionClient
from scripts.model_prep.small_models.encoders import write_model_toml

FAMILY = ZeroShotDetectionClient.family
IMAGE_SIZE, PATCH_SIZE, TEXT_LENGTH = 64, 8, 16
WORDS = ("a", "photo", "of", "cat", "dog", "remote", "control", "the", "person", "car")
START, END = "<|startoftext|>", "<|endoftext|>"


def clip_vocabulary(folder: Path) -> tuple[Path, Path]:
    """``vocab.json`` and ``merges.txt`` of a tiny CLIP BPE (the byte ``!`` is id 0, the pad token, as on the hub)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    characters = list(bytes_to_unicode().values())
    vocabulary = {c: i for i, c in enumerate(characters)}
    vocabulary.update({f"{c}</w>": len(characters) + i for i, c in enumerate(characters)})
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        symbols = [*word[:-1], f"{word[-1]}</w>"]
        joined = symbols[0]
        for symbol in symbols[1:]:
            if (joined, symbol) not in merges:
                merges.append((joined, symbol))
            joined += symbol
            vocabulary.setdefault(joined, len(vocabulary))
    vocabulary[START] = len(vocabulary)
    vocabulary[END] = len(vocabulary)
    (folder / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return folder / "vocab.json", folder / "merges.txt"


def owl_model_folder(models: Path, name: str, kind: str = "owlv2", seed: int = 0) -> Path:
    """``<models>/<name>/`` with ``model.toml`` and ``hf/`` (the detector and its processor)."""
    import torch
    from transformers import (
        CLIPTokenizer,
        Owlv2Config,
        Owlv2ForObjectDetection,
        Owlv2ImageProcessor,
        Owlv2Processor,
        OwlViTConfig,
        OwlViTForObjectDetection,
        OwlViTImageProcessor,
        OwlViTProcessor,
    )

    folder = models / name / "hf"
    vocab, merges = clip_vocabulary(models / name / "vocabulary")
    tokenizer = CLIPTokenizer(
        vocab=str(vocab),
        merges=str(merges),
        bos_token=START,
        eos_token=END,
        unk_token=END,
        pad_token="!",
        model_max_length=TEXT_LENGTH,
    )
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": TEXT_LENGTH,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
    }
    size = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    if kind == "owlv2":
        config, model_class = (
            Owlv2Config(text_config=text, vision_config=vision, projection_dim=32),
            Owlv2ForObjectDetection,
        )
        processor = Owlv2Processor(image_processor=Owlv2ImageProcessor(size=size), tokenizer=tokenizer)
    else:
        config, model_class = (
            OwlViTConfig(text_config=text, vision_config=vision, projection_dim=32),
            OwlViTForObjectDetection,
        )
        processor = OwlViTProcessor(
            image_processor=OwlViTImageProcessor(size=size, crop_size=size), tokenizer=tokenizer
        )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        head = model.class_head
        for layer, bias in ((head.logit_shift, -2.5), (head.logit_scale, 1.0)):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.3)
            layer.bias.fill_(bias)
        model.box_head.dense2.weight.mul_(0.007)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    write_model_toml(models / name, FAMILY)
    return models / name
