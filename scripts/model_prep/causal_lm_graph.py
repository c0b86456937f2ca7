"""A decoder-only model as the one ONNX graph the ``text_generation`` family runs
(``app.core.causal_lm_contract``): a step of the model with its key/value cache in and out.

``torch.onnx.export(dynamo=False, opset 17)`` of ``Step``, a wrapper that rebuilds a ``DynamicCache``
from the flat ``past.<i>.key/value`` tensors, calls the model with ``input_ids``, ``attention_mask``,
``position_ids`` and that cache, and returns the logits of the positions ``logits_positions`` names
(``logits_to_keep``: the last alone at every step but a prompt's whose log-probabilities are asked)
and every layer's keys and values after the step. One graph serves the prompt's step (a past of length 0)
and every later one; its batch, new-token, past and total axes are dynamic. The model is loaded with
eager attention: its masks are plain tensors the exporter follows for any length.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from app.core.causal_lm_contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    LOGITS_POSITIONS,
    POSITION_IDS,
    cache_layout,
    cache_names,
)

OPSET = 17


def layers_of(model: nn.Module) -> int:
    return cache_layout(model.config.to_dict())[0]


def cache_shape(model: nn.Module) -> tuple[int, int]:
    """(key/value heads, head width) of the model's cache."""
    _, kv_heads, head_dim = cache_layout(model.config.to_dict())
    return kv_heads, head_dim


class Step(nn.Module):
    """One step of the model over flat cache tensors (what the graph is exported from)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.layers = layers_of(model)

    def forward(self, input_ids, attention_mask, position_ids, *past_and_kept):
        *past, kept = past_and_kept
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=kept,
        )
        flat = []
        for layer in out.past_key_values.layers[: self.layers]:
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def empty_past(model: nn.Module, batch: int) -> list[torch.Tensor]:
    kv_heads, head_dim = cache_shape(model)
    return [torch.zeros(batch, kv_heads, 0, head_dim) for _ in range(2 * layers_of(model))]


def sample_inputs(model: nn.Module, batch: int = 2, past: int = 3, new: int = 4, seed: int = 0) -> tuple:
    """Inputs of a later step (a past of ``past`` tokens, the second row left-padded by two)."""
    generator = torch.Generator().manual_seed(seed)
    kv_heads, head_dim = cache_shape(model)
    vocabulary = int(model.config.vocab_size)
    ids = torch.randint(0, vocabulary, (batch, new), generator=generator)
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    if batch > 1:
        mask[1, :2] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    cache = [torch.randn(batch, kv_heads, past, head_dim, generator=generator) for _ in range(2 * layers_of(model))]
    return (ids, mask, positions, *cache)


def kept(*positions: int) -> torch.Tensor:
    """A step's ``logits_positions``: the new positions whose logits come out (-1: the last)."""
    return torch.tensor(positions, dtype=torch.int64)


def export(model: nn.Module, path: Path) -> None:
    """``model`` (in eval mode, eager attention) as ``path``: the graph of the contract."""
    layers = layers_of(model)
    past, present = cache_names(layers, "past"), cache_names(layers, "present")
    axes = {
        INPUT_IDS: {0: "batch", 1: "new"},
        ATTENTION_MASK: {0: "batch", 1: "total"},
        POSITION_IDS: {0: "batch", 1: "new"},
        LOGITS: {0: "batch", 1: "kept"},
        LOGITS_POSITIONS: {0: "kept"},
        **{name: {0: "batch", 2: "past"} for name in past},
        **{name: {0: "batch", 2: "total"} for name in present},
    }
    wrapper = Step(model).eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values it fixes (none matter here)
        torch.onnx.export(
            wrapper,
            (*sample_inputs(model), kept(0, -1)),  # two positions: the graph keeps any number
            str(path),
            input_names=[INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past, LOGITS_POSITIONS],
            output_names=[LOGITS, *present],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    wrapper.eval()  # the export restores the wrapper's mode, which would put the model in training
    model.eval()
