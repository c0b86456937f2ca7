"""What makes Grounding DINO's TorchScript trace (``torch.onnx.export(dynamo=False)``) answer images of
every size and prompts of every length as the PyTorch model does: patches applied only while the
model is traced (``traceable()``), each undone after it.

Without them the graph is silently wrong for any image whose feature maps differ from the trace
example's (logits off by up to 0.9, no error from ONNX Runtime), because Python values are frozen at
trace time:

- ``generate_masks_with_special_tokens_and_transfer_map`` uses ``torch.isin``, ``cummax`` and
  ``cummin``, which the exporter has no symbolic for: rewritten with comparisons, masked ``max`` /
  ``min`` and ``row == col`` (the same masks and positions, bit for bit);
- ``torch.as_tensor(spatial_shapes_list)`` is recorded as a constant (it feeds the deformable
  attention's offset normaliser): built with ``torch.stack`` of the traced sizes instead;
- Swin's ``maybe_pad`` (patch embedding, patch merging, window attention) decide in Python whether to
  pad: always pad (by 0 where nothing is needed), and always crop back;
- ``torch.linspace(a, b, steps)`` exports as ``a + i * (b - a) / (steps - 1)``: NaN for a feature
  level one pixel high or wide (a thin image); ``steps - 1`` is clamped to at least 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def text_masks(input_ids: torch.Tensor, special_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``generate_masks_with_special_tokens_and_transfer_map`` without ``isin``, ``cummax``, ``cummin``, ``eye``."""
    batch_size, length = input_ids.shape
    special = (input_ids.unsqueeze(-1) == special_tokens.view(1, 1, -1)).any(-1)
    index = torch.arange(length, device=input_ids.device)
    row, column = index.view(1, -1, 1), index.view(1, 1, -1)
    at = special.unsqueeze(1)
    before = torch.where(at & (column <= row), column, torch.full((), -1, dtype=torch.long)).max(-1).values
    before = torch.cat([before.new_full((batch_size, 1), -1), before[:, :-1]], dim=1)
    end = index[-1] + 1
    after = torch.where(at & (column >= row), column, end).min(-1).values
    valid = (after != 0) & (after != end - 1) & (after != end)
    attention = (after.unsqueeze(2) == after.unsqueeze(1)) & valid.unsqueeze(1)
    attention = (row == column).expand(batch_size, -1, -1) | attention
    positions = torch.where(valid, index.unsqueeze(0) - before - 1, torch.zeros_like(before))
    return attention, torch.clamp(positions, min=0).to(torch.long)


def _as_tensor(original):
    def as_tensor(data, *args, **kwargs):
        if (
            torch.jit.is_tracing()
            and isinstance(data, (list, tuple))
            and data
            and all(isinstance(row, (list, tuple)) for row in data)
            and any(isinstance(v, torch.Tensor) for row in data for v in row)
        ):
            dtype = kwargs.get("dtype", args[0] if args else None) or torch.long
            rows = [torch.stack([v if isinstance(v, torch.Tensor) else torch.tensor(v) for v in row]) for row in data]
            return torch.stack(rows).to(dtype)
        return original(data, *args, **kwargs)

    return as_tensor


def _linspace(original):
    def linspace(start, end, steps, *args, dtype=None, device=None, **kwargs):
        if not torch.jit.is_tracing() or args or kwargs:
            return original(start, end, steps, *args, dtype=dtype, device=device, **kwargs)
        dtype = dtype or torch.get_default_dtype()
        count = steps if isinstance(steps, torch.Tensor) else torch.tensor(steps)
        first = start.to(dtype) if isinstance(start, torch.Tensor) else torch.tensor(start, dtype=dtype)
        last = end.to(dtype) if isinstance(end, torch.Tensor) else torch.tensor(end, dtype=dtype)
        step = (last - first) / torch.clamp(count - 1, min=1).to(dtype)
        return first + torch.arange(count, dtype=dtype, device=device) * step

    return linspace


def _patch_pad(self, pixel_values, height, width):
    pad_width = (self.patch_size[1] - width % self.patch_size[1]) % self.patch_size[1]
    pad_height = (self.patch_size[0] - height % self.patch_size[0]) % self.patch_size[0]
    return nn.functional.pad(pixel_values, (0, pad_width, 0, pad_height))


def _merging_pad(self, input_feature, height, width):
    return nn.functional.pad(input_feature, (0, 0, 0, width % 2, 0, height % 2))


def _window_pad(self, hidden_states, height, width):
    pad_right = (self.window_size - width % self.window_size) % self.window_size
    pad_bottom = (self.window_size - height % self.window_size) % self.window_size
    hidden_states = nn.functional.pad(hidden_states, (0, 0, 0, pad_right, 0, pad_bottom))
    return hidden_states, (0, 0, 0, 1, 0, 1)  # truthy: SwinLayer always records its (possibly empty) crop


@contextlib.contextmanager
def traceable() -> Iterator[None]:
    """The patches, while the block runs."""
    from transformers.models.grounding_dino import modeling_grounding_dino as grounding
    from transformers.models.swin import modeling_swin as swin

    saved = [
        (grounding, "generate_masks_with_special_tokens_and_transfer_map", text_masks),
        (torch, "as_tensor", _as_tensor(torch.as_tensor)),
        (torch, "linspace", _linspace(torch.linspace)),
        (swin.SwinPatchEmbeddings, "maybe_pad", _patch_pad),
        (swin.SwinPatchMerging, "maybe_pad", _merging_pad),
        (swin.SwinLayer, "maybe_pad", _window_pad),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in saved]
    try:
        for owner, name, patch in saved:
            setattr(owner, name, patch)
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
