"""Quantized weights on OpenVINO (``scripts/model_prep/causal_lm_quantize.py``), on a graph of two
matrix products built here: what each product becomes, and that OpenVINO computes the products with
exactly the weights the quantization wrote (each recomputed here in numpy from the float32 ones)."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.causal_lm_contract import PRECISE
from scripts.model_prep import causal_lm_quantize as quantize

INPUTS, HIDDEN, VOCABULARY = 96, 40, 50  # 96 inputs: cut by 32 into 3 groups (not by 128 or 64)


def two_products(first: np.ndarray, head: np.ndarray, transposed: bool):
    """``x @ first`` then ``@ head`` into an output named ``logits``, float32; the weights as given
    (``[outputs, inputs]``), stored transposed or not as the product reads them."""
    import openvino as ov
    from openvino import opset13

    x = opset13.parameter([1, 2, INPUTS], ov.Type.f32, name="x")
    hidden = opset13.matmul(x, opset13.constant(first if transposed else first.T.copy()), False, transposed)
    logits = opset13.matmul(hidden, opset13.constant(head if transposed else head.T.copy()), False, transposed)
    result = opset13.result(logits)
    result.output(0).get_tensor().set_names({"logits"})
    return ov.Model([result], [x], "two_products")


def int4_reference(weights: np.ndarray, group: int) -> np.ndarray:
    """Each row's groups of ``group`` inputs scaled by their largest magnitude over 7 (float16), rounded
    to -8..7, multiplied back."""
    grouped = weights.reshape(weights.shape[0], -1, group)
    scale = (np.abs(grouped).max(axis=2, keepdims=True) / 7.0).astype(np.float16).astype(np.float32)
    return (np.clip(np.round(grouped / scale), -8, 7) * scale).reshape(weights.shape)


def int8_reference(weights: np.ndarray) -> np.ndarray:
    scale = np.abs(weights).max(axis=1, keepdims=True) / 127.0
    return np.clip(np.round(weights / scale), -127, 127) * scale


def computed(model, x: np.ndarray) -> np.ndarray:
    """The model on the CPU in float32, its dynamic quantization of activations off: the weights alone
    differ from float32."""
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {**PRECISE, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    return compiled({"x": x})[compiled.output(0)]


@pytest.mark.parametrize("transposed", [True, False])
def test_int4_weights_are_grouped_the_head_int8_and_openvino_computes_what_was_written(transposed):
    rng = np.random.default_rng(0)
    first = rng.normal(size=(HIDDEN, INPUTS)).astype(np.float32)
    head = rng.normal(size=(VOCABULARY, HIDDEN)).astype(np.float32)
    x = rng.normal(size=(1, 2, INPUTS)).astype(np.float32)
    model = two_products(first, head, transposed)
    exact = computed(model, x)

    assert quantize.compress(model, "int4") == {"int4": 1, "int8": 1}
    types = {op.get_output_element_type(0).get_type_name() for op in model.get_ordered_ops()}
    assert {"i4", "i8"} <= types, types
    want = x @ int4_reference(first, 32).T @ int8_reference(head).T
    got = computed(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # and the quantization's error is what int4 costs: far from nothing, far from the values' size
    apart = np.abs(got - exact).mean() / np.abs(exact).mean()
    assert 0.01 < apart < 0.2, apart


def test_int8_weights_are_per_output_channel_everywhere():
    rng = np.random.default_rng(1)
    first = rng.normal(size=(HIDDEN, INPUTS)).astype(np.float32)
    head = rng.normal(size=(VOCABULARY, HIDDEN)).astype(np.float32)
    x = rng.normal(size=(1, 2, INPUTS)).astype(np.float32)
    model = two_products(first, head, True)

    assert quantize.compress(model, "int8") == {"int4": 0, "int8": 2}
    want = x @ int8_reference(first).T @ int8_reference(head).T
    np.testing.assert_allclose(computed(model, x), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("inputs", "group"),
    [(4096, 128), (1536, 128), (576, 64), (96, 32), (64, 32), (32, None), (100, None)],
)
def test_an_int4_group_cuts_a_product_s_inputs_in_two_or_more(inputs, group):
    assert quantize.int4_group(inputs) == group
