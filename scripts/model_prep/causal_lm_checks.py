"""What preparation holds a ``text_generation`` export to, whichever engine runs it: the check's two
prompts, ``generate``'s greedy tokens for them (none of the folder's other settings), tokens cut at
their first end-of-sequence id, and the one line that stops preparation when a check fails
(``causal_lm_export`` for the ONNX graph, ``causal_lm_openvino`` for the OpenVINO IR)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from app.core.causal_lm_contract import ARCHITECTURES, MIN_AGREEMENT, MIN_AGREEMENT_KEY
from app.core.spec import ModelSpec
from scripts.model_prep.onnx_export import ExportError

CHECK_NEW_TOKENS = 8
PROMPT_TOKENS = (6, 4)  # the greedy check's two prompts; the second is left-padded to the first


def refusal(spec: ModelSpec, what: str) -> ExportError:
    """The one line that stops preparation: the folder, its model_type and what failed."""
    kind = spec.text.model_type
    served = "" if kind in ARCHITECTURES else f"; {spec.family} serves {', '.join(ARCHITECTURES)}"
    return ExportError(f"[{spec.name}] {spec.text.folder}: model_type {kind!r}: {what}{served}")


def first_line(error: BaseException, limit: int = 300) -> str:
    """An error's class and the first line of its message (at most ``limit`` characters)."""
    text = str(error).strip().splitlines()
    return f"{error.__class__.__name__}: {text[0][:limit] if text else ''}".rstrip(": ")


def prompts(model: nn.Module, pad: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of token ids past the first few (the special ones), the second left-padded."""
    vocabulary = int(model.config.vocab_size)
    rng = np.random.default_rng(seed)
    longest = max(PROMPT_TOKENS)
    ids = torch.full((len(PROMPT_TOKENS), longest), pad, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(PROMPT_TOKENS):
        ids[row, longest - length :] = torch.from_numpy(rng.integers(min(5, vocabulary - 1), vocabulary, size=length))
        mask[row, longest - length :] = 1
    return ids, mask


def positions(mask: np.ndarray) -> np.ndarray:
    """Each token's position, counted over the attention mask as ``generate`` counts it (padding: 1)."""
    found = mask.cumsum(-1) - 1
    found[mask == 0] = 1
    return found


def cut(rows, ends: tuple[int, ...]) -> list[list[int]]:
    """Each row's new tokens up to and including its first end-of-sequence token."""
    found = []
    for row in rows:
        row = [int(t) for t in row]
        stop = next((i for i, token in enumerate(row) if token in ends), len(row) - 1)
        found.append(row[: stop + 1])
    return found


def greedy_generate(model: nn.Module, ids, mask, ends: tuple[int, ...], pad: int) -> list[list[int]]:
    """The PyTorch model's ``generate(do_sample=False)``: greedy, none of the folder's other settings."""
    from transformers import GenerationConfig

    settings = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=list(ends) or None, pad_token_id=pad)
    try:
        with torch.no_grad():
            found = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=CHECK_NEW_TOKENS, do_sample=False)
    finally:
        model.generation_config = settings
    model.eval()
    return cut(found[:, ids.shape[1] :], ends)


def end_ids(spec: ModelSpec, model: nn.Module) -> tuple[tuple[int, ...], int]:
    """The folder's end-of-sequence ids (its generation config's, else config.json's) and the padding id."""
    from app.triton.onnx_generate import generation_config

    settings = generation_config(spec.text.folder)
    found = settings.eos_token_id if settings.eos_token_id is not None else model.config.eos_token_id
    ends = tuple(int(i) for i in (found if isinstance(found, (list, tuple)) else [found] if found is not None else []))
    pad = settings.pad_token_id if settings.pad_token_id is not None else (ends[0] if ends else 0)
    return ends, int(pad)


def min_agreement(spec: ModelSpec) -> float:
    """The agreement with float32 that lowered weights or arithmetic need: ``[export] min_agreement``
    (0 to 1), else the contract's ``MIN_AGREEMENT``."""
    given = spec.export.get(MIN_AGREEMENT_KEY)
    if given is None:
        return MIN_AGREEMENT
    if isinstance(given, bool) or not isinstance(given, int | float) or not 0 <= given <= 1:
        raise ExportError(f"[{spec.name}] [export] {MIN_AGREEMENT_KEY} = {given!r}: a number from 0 to 1")
    return float(given)
