"""Items made one batch: the per-item arrays of a request stacked along a new first axis."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def stack(arrays: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """One batch from per-item arrays; items of different lengths (an encoded image's bytes) are
    zero-padded at the end to the longest."""
    if len({a.shape for a in arrays}) > 1:
        shape = tuple(max(sizes) for sizes in zip(*(a.shape for a in arrays)))
        batch = np.zeros((len(arrays), *shape), dtype=dtype)
        for row, array in zip(batch, arrays):
            row[tuple(slice(0, n) for n in array.shape)] = array
        return batch
    if len(arrays) == 1:  # most requests: a view with a batch axis, no copy
        return np.asarray(arrays[0])[np.newaxis].astype(dtype, copy=False)
    return np.stack(arrays).astype(dtype, copy=False)
