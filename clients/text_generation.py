"""Text generation family: decoder-only causal language models (GPT-2, Llama, Qwen2/Qwen3, Mistral,
Phi-3 style), answered as Hugging Face's ``model.generate`` answers, whole or streamed token by token.

The router renders the prompt (a chat template for OpenAI's ``messages``), tokenizes, checks and
decodes; the generation runs inside Triton (``app/triton/causal_lm_model.py``), a decoupled model
whose step scheduler lets a request join the running batch at the next step and streams each token
back as it is made (``app.core.causal_lm_contract``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core import causal_lm_contract, text_spec
from app.core.family import Family
from app.core.text_spec import TextSpecError
from clients.text import TextClient

FAMILY_NAME = "text_generation"


class TextGenerationClient(TextClient[None]):
    family = FAMILY_NAME


def _decoder_only(config: Mapping[str, Any], folder: Path) -> None:
    if config.get("is_encoder_decoder") is True:
        raise TextSpecError(
            f"{folder / 'config.json'}: the {FAMILY_NAME} family serves decoder-only models (GPT-2, Llama, Qwen, "
            f"Mistral, Phi-3); this {config.get('model_type', 'model')!r} model is an encoder-decoder: "
            'family = "text2text_generation" serves it'
        )


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], text_spec.TextModel]:
    """A text_generation model.toml from its folder: the generation tensors (``app.core.causal_lm_contract``).
    Its Triton model batches the requests itself: a ``max_batch_size`` other than 0 is refused."""
    if raw.get("max_batch_size", 0) != 0:
        raise TextSpecError(
            f"{where}: max_batch_size must be 0 for {FAMILY_NAME} (or left out): its Triton model batches the "
            "requests itself (each joins the running batch at the next step), so Triton batches none"
        )
    return text_spec.resolve(
        raw,
        folder,
        where,
        inputs=lambda *_: causal_lm_contract.inputs(),
        outputs=lambda *_: causal_lm_contract.outputs(),
        max_batch_size=0,
        check=_decoder_only,
    )


FAMILY = Family(
    name=FAMILY_NAME,
    client=TextGenerationClient,
    complete=complete,
    export="scripts.model_prep.causal_lm_export:CAUSAL_LM",
    loop=True,
    streams=True,
)
