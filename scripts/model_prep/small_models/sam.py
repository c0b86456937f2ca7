"""Small SAM and SAM-HQ folders: the mask_generation family's small models.

Each folder is what ``save_pretrained`` writes for a ``SamModel`` and its ``SamProcessor`` (``kind``
"sam_hq": a ``SamHQModel`` and its ``SamHQProcessor``, its HQ decoder reading the global layer's
output, ``vit_dim`` the encoder's width) of a tiny config (a vision encoder of width 32 and two
layers, one windowed and one global, on 256-pixel inputs: a 16x16 embedding grid, 64x64
low-resolution masks) with seeded random weights (``sam_export.randomise``: the vision encoder's own
initialisation is near zero), and the two-line ``model.toml`` beside it. Nothing here downloads anything.
"""

from __future__ import annotations

from pathlib import Path

from app.core.mask_contract import SAM, SAM_HQ
from clients.mask_generation import MaskGenerationClient
from scripts.model_prep.sam_export import random_model
from scripts.model_prep.sam_graphs import KINDS
from scripts.model_prep.small_models.encoders import write_model_toml

FAMILY = MaskGenerationClient.family


def sam_config(image_size: int = 256, hidden: int = 32, kind: str = SAM):
    from transformers import SamConfig, SamHQConfig

    vision = {
        "hidden_size": hidden,
        "output_channels": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": image_size,
        "patch_size": 16,
        "window_size": 6,  # the 16x16 grid is padded to 18 for its windows, as SAM pads 64 to 70
        "global_attn_indexes": [1],
        "num_pos_feats": hidden // 2,
        "mlp_dim": 2 * hidden,
    }
    prompt = {"hidden_size": hidden, "image_size": image_size, "patch_size": 16, "mask_input_channels": 8}
    decoder = {
        "hidden_size": hidden,
        "mlp_dim": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "iou_head_hidden_dim": hidden,
    }
    if kind == SAM_HQ:
        decoder["vit_dim"] = hidden  # the width of the ViT layer its decoder reads
    config = SamHQConfig if kind == SAM_HQ else SamConfig
    return config(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)


def sam_model_folder(models: Path, name: str, image_size: int = 256, seed: int = 0, kind: str = SAM) -> Path:
    """``<models>/<name>/`` with ``model.toml`` and ``hf/`` (SamModel + SamProcessor, or SAM-HQ's)."""
    from transformers import SamImageProcessor

    model = random_model(KINDS[kind], sam_config(image_size, kind=kind), seed)
    folder = models / name / "hf"
    model.save_pretrained(folder)
    low_res = image_size // 4
    processor = SamImageProcessor(
        size={"longest_edge": image_size},
        pad_size={"height": image_size, "width": image_size},
        mask_size={"longest_edge": low_res},
        mask_pad_size={"height": low_res, "width": low_res},
    )
    KINDS[kind].classes()[1](image_processor=processor).save_pretrained(folder)
    write_model_toml(models / name, FAMILY)
    return models / name
