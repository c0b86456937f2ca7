"""ONNX graphs changed on purpose, for the tests of the exports' checks (a graph that must be refused):
``rewritten`` writes a graph's copy with a change applied, ``perturb`` is one such change."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def rewritten(graph: Path, target: Path, change) -> Path:
    import onnx

    proto = onnx.load(str(graph))
    change(proto)
    onnx.save(proto, str(target))
    return target


def perturb(proto) -> None:
    """Every weight of a thousand values or more off by a thousandth of its spread (seeded)."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    for index, tensor in enumerate(proto.graph.initializer):
        values = numpy_helper.to_array(tensor)
        if values.dtype == np.float32 and values.size >= 1000:
            noise = rng.normal(0, 1e-3 * float(values.std()), values.shape).astype(np.float32)
            proto.graph.initializer[index].CopyFrom(numpy_helper.from_array(values + noise, tensor.name))
