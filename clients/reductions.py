"""numpy's reductions for the token-classification pipeline (``clients.entities``), bit for bit, run over
all of a window's tokens or segments at once instead of a short row at a time: np.nanmean of each
segment, the argmax and the first maximum of each segment. A mean's sum reproduces numpy's order of
additions (its ``pairwise_sum``), not a cumulative sum's or np.add.reduceat's, so that every score equals
the pipeline's to the last bit."""

from __future__ import annotations

import contextlib

import numpy as np

# numpy's sum adds fewer than this many numbers one after the other (its pairwise_sum: np.sum, np.nanmean)
PAIRWISE = 8


def nanmeans(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``np.nanmean(values[start:end], axis=0)`` of each segment, bit for bit (values float32: float32 means).

    np.nanmean reads NaN as 0, sums (in the values' dtype) and divides by how many are not NaN (the float32
    sum divided in float64, rounded back). numpy sums fewer than ``PAIRWISE`` numbers one after the other,
    0 + v0 + v1 + ..., and the rows of a 2-D array row by row: those segments are summed here together,
    position by position (without NaN, as most are, each divided by its length). A longer one (rare: numpy's
    pairwise order) is given to np.nanmean itself. np.add.reduceat is not the same: it starts from v0 and adds
    the pairwise sum of the rest."""
    lengths = ends - starts
    short = lengths < PAIRWISE
    every = short.all()
    nan = np.isnan(values)
    counts = (~nan).astype(np.intp) if nan.any() else None
    zeroed = values if counts is None else np.where(nan, values.dtype.type(0), values)
    first, lengths = (starts, lengths) if every else (starts[short], lengths[short])
    total = zeroed[first]
    count = lengths.reshape(-1, *[1] * (values.ndim - 1)) if counts is None else counts[first]
    for offset in range(1, int(lengths.max(initial=0))):
        more = np.flatnonzero(lengths > offset)
        total[more] += zeroed[first[more] + offset]
        if counts is not None:
            count[more] += counts[first[more] + offset]
    # all NaN: 0 / 0, NaN as np.nanmean gives (without its warning)
    with np.errstate(invalid="ignore") if counts is not None else contextlib.nullcontext():
        found = (total.astype(np.float64) / count).astype(values.dtype)
    if every:
        return found
    means = np.empty((len(starts), *values.shape[1:]), values.dtype)
    means[short] = found
    for i in np.flatnonzero(~short):
        means[i] = np.nanmean(values[starts[i] : ends[i]], axis=0)
    return means


def best(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``scores.argmax()`` and ``scores[idx]`` of each row: the label ids and their scores."""
    label_ids = scores.argmax(axis=-1)
    return label_ids, scores[np.arange(len(scores)), label_ids]


def first_max(keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``max(entities, key=...)`` of each segment of ``keys`` (one segment from each start to the next): the
    position of its first highest key. As Python's max, a NaN key never wins, and a NaN first key is kept
    (nothing compares greater than it)."""
    nan = np.isnan(keys)
    filled = np.where(nan, -np.inf, keys)
    highest = np.repeat(np.maximum.reduceat(filled, starts), np.diff(starts, append=len(keys)))
    positions = np.where(filled == highest, np.arange(len(keys)), len(keys))
    return np.where(nan[starts], starts, np.minimum.reduceat(positions, starts))
