"""Quantized weights for a ``text_generation`` model on OpenVINO (``[export] weights = "int8"`` or
``"int4"``), and the check that holds them to the float32 model (``app.core.causal_lm_contract``:
``MIN_AGREEMENT``).

``int8``: every matrix product's float32 weight (each layer's projections and the language-model
head) becomes int8 with one float32 scale per output channel (symmetric, the largest magnitude to
127), decompressed in the graph (``Convert`` then ``Multiply``), the pattern OpenVINO's CPU plugin
runs as an int8-weight product (NNCF's weight compression writes the same, with a zero point where it
is asymmetric). ``int4``: each layer's projections become int4 with one float16 scale per output
channel and group of inputs (``int4_group``; symmetric, the largest magnitude to 7), NNCF's
``INT4_SYM`` pattern; the language-model head stays int8, as NNCF keeps the last layer by default.
Activations and the key/value cache stay float32; the token embedding's lookup keeps its float32 table.

The check, on ``SENTENCES`` encoded by the folder's tokenizer: the float32 IR's greedy continuation of
each (``CONTINUATION`` tokens), then both IRs run over prompt and continuation at once (teacher
forcing: each position sees the float32 model's own past, so one differing choice does not change
every later one); at each continuation position, whether the quantized model's largest logit is the
float32 model's token (the agreement) and how far its log-probability of that token is from the
float32 model's (the mean absolute difference).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.causal_lm_contract import INT4_GROUPS, IR_FILE, IR_WEIGHTS, PRECISE

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Tokyo is the capital of Japan, and Paris is the capital of",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "The mitochondria is the powerhouse of the cell because",
    "Q: What is 12 times 7?\nA:",
    "Le café est une boisson",
    "In 1969, the first humans landed on",
)
CONTINUATION = 16


@dataclass(frozen=True)
class Agreement:
    """What the check found: next tokens compared, how many agree, the mean |difference| of log-probs."""

    positions: int
    agreeing: int
    mean_abs_logprob_diff: float

    @property
    def ratio(self) -> float:
        return self.agreeing / self.positions if self.positions else 1.0

    def line(self) -> str:
        return (
            f"greedy next-token agreement with float32 {100 * self.ratio:.1f}% ({self.agreeing} of {self.positions}), "
            f"mean |difference| of their log-probabilities {self.mean_abs_logprob_diff:.4f}"
        )


def products(model) -> list[tuple[object, np.ndarray]]:
    """``model``'s matrix products over a float32 2-D constant: each ``MatMul`` and its weight's values."""
    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        weight = op.input_value(1).get_node()
        if weight.get_type_name() != "Constant":
            continue
        values = weight.get_data()
        if values.dtype == np.float32 and values.ndim == 2:
            found.append((op, values))
    return found


def head_of(model):
    """The matrix product that makes ``logits`` (the language-model head), or None."""
    names = [output for output in model.outputs if "logits" in output.get_names()]
    node = names[0].get_node().input_value(0).get_node() if names else None
    while node is not None and node.get_type_name() != "MatMul":
        node = node.input_value(0).get_node() if node.get_input_size() else None
    return node


def int8_channels(values: np.ndarray, transposed: bool):
    """``values`` as int8 with one float32 scale per output channel (symmetric, the largest magnitude to
    127), decompressed in the graph: ``Convert`` then ``Multiply``."""
    import openvino as ov
    from openvino import opset13

    reduced = 1 if transposed else 0  # the input axis
    scale = np.abs(values).max(axis=reduced, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    quantized = np.clip(np.round(values / scale), -127, 127).astype(np.int8)
    return opset13.multiply(
        opset13.convert(opset13.constant(quantized), ov.Type.f32), opset13.constant(scale.astype(np.float32))
    )


def int4_groups(values: np.ndarray, transposed: bool, group: int):
    """``values`` as int4 with one float16 scale per output channel and ``group`` inputs (symmetric, the
    largest magnitude to 7), decompressed in the graph as NNCF writes it: ``Convert``, ``Multiply``,
    ``Reshape`` to the product's weight, ``Convert`` to float32 (OpenVINO's CPU plugin runs the pattern
    as an int4-weight product)."""
    import openvino as ov
    from openvino import opset13

    # [outputs, inputs], contiguous: OpenVINO takes a strided float16 array's constant as int16
    rows = np.ascontiguousarray(values if transposed else values.T)
    outputs, inputs = rows.shape
    grouped = rows.reshape(outputs, inputs // group, group)
    scale = np.abs(grouped).max(axis=2, keepdims=True) / 7.0
    scale[scale == 0] = 1.0
    scale = scale.astype(np.float16)
    quantized = np.clip(np.round(grouped / scale.astype(np.float32)), -8, 7).astype(np.int8)
    decompressed = opset13.multiply(
        opset13.convert(opset13.constant(quantized, dtype=ov.Type.i4), ov.Type.f16), opset13.constant(scale)
    )
    weight = opset13.reshape(decompressed, opset13.constant(np.array([outputs, inputs], np.int64)), False)
    weight = opset13.convert(weight, ov.Type.f32)
    return weight if transposed else opset13.transpose(weight, opset13.constant(np.array([1, 0], np.int64)))


def int4_group(inputs: int) -> int | None:
    """The inputs that share one int4 scale: ``INT4_GROUPS``' first size that cuts ``inputs`` into two
    groups or more (None: no size does, the product stays int8)."""
    return next((size for size in INT4_GROUPS if inputs % size == 0 and inputs // size >= 2), None)


def compress(model, weights: str = "int8") -> dict[str, int]:
    """``model``'s float32 matrix-product weights in ``weights``' format, in place: ``int8`` per output
    channel; ``int4`` in groups of inputs (``int4_group``), the language-model head and any product no
    group size cuts kept int8 (as NNCF keeps the last layer).
    How many products each format took."""
    head = head_of(model) if weights == "int4" else None
    kept = head.get_friendly_name() if head is not None else None  # the head, kept int8
    counts = {"int8": 0, "int4": 0}
    for op, values in products(model):
        transposed = op.get_transpose_b()
        inputs = values.shape[1 if transposed else 0]
        group = int4_group(inputs) if weights == "int4" else None
        if group is None or op.get_friendly_name() == kept:
            decompressed = int8_channels(values, transposed)
            counts["int8"] += 1
        else:
            decompressed = int4_groups(values, transposed, group)
            counts["int4"] += 1
        op.input(1).replace_source_output(decompressed.output(0))
    model.validate_nodes_and_infer_types()
    return counts


def quantize(folder: Path, original: Path, weights: str = "int8") -> dict[str, int]:
    """``folder``'s IR moved to ``original``, then written again with ``weights``; the products compressed."""
    import openvino as ov

    original.mkdir(parents=True, exist_ok=True)
    for name in (IR_FILE, IR_WEIGHTS):
        shutil.move(folder / name, original / name)
    model = ov.Core().read_model(str(original / IR_FILE))
    counts = compress(model, weights)
    ov.save_model(model, str(folder / IR_FILE), compress_to_fp16=False)
    return counts


def log_probabilities(folder: Path, sequences: list[list[int]], properties=PRECISE) -> list[np.ndarray]:
    """The IR's log-softmax over each whole sequence at once (``[positions, vocabulary]``), computed with
    OpenVINO's CPU ``properties`` (float32 by default)."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(folder / IR_FILE), "CPU", dict(properties))
    request = compiled.create_infer_request()
    found = []
    for ids in sequences:
        request.reset_state()
        length = len(ids)
        outputs = request.infer(
            {
                "input_ids": np.array([ids], np.int64),
                "attention_mask": np.ones((1, length), np.int64),
                "position_ids": np.arange(length, dtype=np.int64)[None],
                "beam_idx": np.zeros(1, np.int32),
            }
        )
        logits = np.asarray(outputs[compiled.output("logits")][0], np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        found.append(shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))
    return found


def agreement(
    original: Path, quantized: Path, prompts: list[list[int]], continuations: list[list[int]], properties=PRECISE
) -> Agreement:
    """The quantized IR (computed with ``properties``) against the original in float32, over each prompt
    and the original's greedy continuation."""
    sequences = [prompt + continuation for prompt, continuation in zip(prompts, continuations)]
    wanted, got = log_probabilities(original, sequences), log_probabilities(quantized, sequences, properties)
    positions = agreeing = 0
    differences = []
    for prompt, continuation, ours, theirs in zip(prompts, continuations, wanted, got):
        for i, token in enumerate(continuation):
            at = len(prompt) - 1 + i  # the position whose next token is ``token``
            positions += 1
            agreeing += int(theirs[at].argmax() == token)
            differences.append(abs(float(ours[at, token] - theirs[at, token])))
    return Agreement(positions, agreeing, float(np.mean(differences)) if differences else 0.0)


def encoded_sentences(folder: Path) -> list[list[int]]:
    """``SENTENCES`` as the folder's tokenizer encodes them (special tokens as it adds them)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [encoding.ids for encoding in tokenizer.encode_batch(list(SENTENCES))]
