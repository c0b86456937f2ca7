"""COCO run-length encoding of binary masks, in numpy, as ``pycocotools.mask`` writes and reads it.

``encode(mask)`` gives ``{"size": [h, w], "counts": str}``: ``pycocotools.mask.encode`` of the mask
as Fortran-ordered uint8, with its ``counts`` bytes as ASCII text (JSON has no bytes), which
``pycocotools.mask.decode`` takes as it is. ``decode`` is its inverse.

The format (maskApi.c's ``rleEncode`` and ``rleToString``): the lengths of the runs of the mask
flattened column by column, the first run of zeros (0 when the first pixel is set); from the fourth
run on, each is written as its difference with the run two before; each value in groups of 5 bits,
lowest first, ``0x20`` marking that another group follows and ``0x10`` of the last group its sign,
each group plus 48 as one character.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

GROUP_BITS, MORE, SIGN, OFFSET = 5, 0x20, 0x10, 48
MAX_GROUPS = 13  # 5 bits a group: enough for any run of a 64-bit count


def run_lengths(mask: np.ndarray) -> np.ndarray:
    """(h, w) mask -> the lengths of its column-major runs, the first of zeros (possibly 0)."""
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    if flat.size == 0:
        return np.zeros(1, dtype=np.int64)
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate(([0], changes, [flat.size])))
    return np.concatenate(([0], counts)) if flat[0] else counts


def counts_to_string(counts: np.ndarray) -> str:
    """Run lengths -> pycocotools' compressed counts (``rleToString``)."""
    values = np.asarray(counts, dtype=np.int64).copy()
    values[3:] -= np.asarray(counts, dtype=np.int64)[1:-2]
    groups, active = [], np.ones(len(values), dtype=bool)
    for _ in range(MAX_GROUPS):
        low = values & 0x1F
        values = values >> GROUP_BITS  # arithmetic, as C's shift of a long
        more = np.where(low & SIGN, values != -1, values != 0)
        groups.append(np.where(active, (low | np.where(more, MORE, 0)) + OFFSET, -1))
        active = active & more
        if not active.any():
            break
    chars = np.stack(groups, axis=1).ravel()  # value by value, low group first
    return chars[chars >= 0].astype(np.uint8).tobytes().decode("ascii")


def string_to_counts(text: str | bytes) -> np.ndarray:
    """pycocotools' compressed counts -> run lengths (``rleFrString``)."""
    raw = text.encode("ascii") if isinstance(text, str) else text
    chars = np.frombuffer(raw, dtype=np.uint8).astype(np.int64) - OFFSET
    if chars.size == 0:
        return np.zeros(0, dtype=np.int64)
    last = (chars & MORE) == 0
    starts = np.flatnonzero(np.concatenate(([True], last[:-1])))
    value_of = np.concatenate(([0], np.cumsum(last)[:-1]))
    group = np.arange(chars.size) - starts[value_of]
    values = np.add.reduceat((chars & 0x1F) << (GROUP_BITS * group), starts)
    ends = np.flatnonzero(last)
    negative = (chars[ends] & SIGN) != 0
    values[negative] -= np.left_shift(1, GROUP_BITS * (group[ends[negative]] + 1))
    counts = values.copy()
    counts[1::2] = np.cumsum(values[1::2])  # counts[i] = value[i] + counts[i - 2], from i = 3
    counts[2::2] = np.cumsum(values[2::2])
    return counts


def encode(mask: np.ndarray) -> dict[str, Any]:
    """(h, w) binary mask -> ``{"size": [h, w], "counts": str}``, pycocotools' RLE."""
    mask = np.asarray(mask)
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts_to_string(run_lengths(mask))}


def decode(rle: Mapping[str, Any]) -> np.ndarray:
    """pycocotools' RLE (counts as str or bytes) -> the (h, w) uint8 mask."""
    height, width = (int(v) for v in rle["size"])
    counts = string_to_counts(rle["counts"])
    if int(counts.sum()) != height * width:
        raise ValueError(f"RLE counts cover {int(counts.sum())} pixels, not {height}x{width}")
    values = np.zeros(len(counts), dtype=np.uint8)
    values[1::2] = 1
    return np.ascontiguousarray(np.repeat(values, counts).reshape(width, height).T)
