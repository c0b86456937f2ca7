"""Small Grounding DINO folders: the zero_shot_object_detection family's third kind.

Each folder is what ``save_pretrained`` writes for a ``GroundingDinoForObjectDetection`` and its
``GroundingDinoProcessor`` of a tiny config (a Swin backbone of width 16, two blocks a stage, so that
shifted windows run; a BERT of width 32 and one layer on 256 positions; d_model 32, one encoder and two
decoder layers, 30 queries, four feature levels) with seeded random weights, images resized to a
shortest side of 200 (longest 333), and the two-line ``model.toml`` beside it.

The WordPiece vocabulary keeps BERT's ids where Grounding DINO reads them by number (``[CLS]`` 101,
``[SEP]`` 102, "." 1012, "?" 1029: its ``SPECIAL_TOKENS``), a few words after them. With random weights
the contrastive logits (a raw dot product) put every score at 1.0; the decoder's final LayerNorm is
scaled by 0.06 so that they spread over 0.3 to 0.7. Nothing here downloads anything.
"""

from __future__ import annotations

from pathlib import Path

from scripts.model_prep.small_models.encoders import write_model_toml
from scripts.model_prep.small_models.owl import FAMILY

WORDS = ("a", "an", "the", "cat", "cats", "remote", "control", "dog", "dogs", "person", "car", "red", "blue")
WORDS += ("small", "big", "on", "of", "and", "couch", "photo", "bird", "tree", "table", "##s", "##ing", ",")
SPECIAL = {101: "[CLS]", 102: "[SEP]", 103: "[MASK]", 100: "[UNK]", 0: "[PAD]", 1012: ".", 1029: "?"}
TEXT_POSITIONS = 256  # Grounding DINO's max_text_len: the prompt's limit


def bert_vocabulary() -> dict[str, int]:
    """BERT's special ids and "." and "?" where BERT has them, unused tokens between, the words after."""
    tokens = [SPECIAL.get(index, f"[unused{index}]") for index in range(1030)]
    return {token: index for index, token in enumerate([*tokens, *WORDS])}


def gdino_model_folder(models: Path, name: str, seed: int = 0) -> Path:
    """``<models>/<name>/`` with ``model.toml`` and ``hf/`` (the detector and its processor)."""
    import torch
    from transformers import (
        BertConfig,
        BertTokenizerFast,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
        SwinConfig,
    )

    vocabulary = bert_vocabulary()
    tokenizer = BertTokenizerFast(vocab=vocabulary, do_lower_case=True, model_max_length=TEXT_POSITIONS)
    backbone = SwinConfig(
        image_size=224,
        patch_size=4,
        embed_dim=16,
        depths=[2, 2, 2, 2],
        num_heads=[1, 1, 2, 2],
        window_size=7,
        out_indices=[2, 3, 4],
    )
    text = BertConfig(
        vocab_size=len(vocabulary),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=TEXT_POSITIONS,
    )
    config = GroundingDinoConfig(
        backbone_config=backbone,
        text_config=text,
        d_model=32,
        num_queries=30,
        encoder_layers=1,
        decoder_layers=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_n_points=2,
        decoder_n_points=2,
        num_feature_levels=4,
        max_text_len=TEXT_POSITIONS,
        disable_custom_kernels=True,
    )
    torch.manual_seed(seed)
    model = GroundingDinoForObjectDetection(config).eval()
    spread_scores(model)
    folder = models / name / "hf"
    model.save_pretrained(folder)
    processor = GroundingDinoImageProcessor(size={"shortest_edge": 200, "longest_edge": 333})
    GroundingDinoProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(folder)
    write_model_toml(models / name, FAMILY)
    return models / name


def spread_scores(model) -> None:
    """Random weights make a Grounding DINO's logits large (sigmoid 1.0 for a hundred queries at full
    size): its decoder's final norm scaled by 0.06 spreads the scores over about 0.3 to 0.9, as a
    trained model's spread, so that thresholds choose among them."""
    import torch

    with torch.no_grad():
        model.model.decoder.layer_norm.weight.mul_(0.06)
