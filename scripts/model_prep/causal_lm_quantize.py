"""Quantized weights for a ``text_generation`` model on OpenVINO (``[export] weights = "int8"``), and
the check that holds them to the float32 model (``app.core.causal_lm_contract``: ``MIN_AGREEMENT``).

``int8``: every matrix product's float32 weight (each layer's projections and the language-model
head) becomes int8 with one float32 scale per output channel (symmetric, the largest magnitude to
127), decompressed in the graph (``Convert`` then ``Multiply``), the pattern OpenVINO's CPU plugin
runs as an int8-weight product (NNCF's weight compression writes the same, with a zero point where it
is asymmetric). Activations and the key/value cache stay float32; the token embedding's lookup keeps
its float32 table.

The check, on ``SENTENCES`` encoded by the folder's tokenizer: the float32 IR's greedy continuation of
each (``CONTINUATION`` tokens), then both IRs run over prompt and continuation at once (teacher
forcing: each position sees the float32 model's own past, so one differing choice does not change
every later one); at each continuation position, whether the int8 model's largest logit is the
float32 model's token (the agreement) and how far its log-probability of that token is from the
float32 model's (the mean absolute difference).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.causal_lm_contract import IR_FILE, IR_WEIGHTS, PRECISE

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


def compress_int8(model) -> int:
    """``model``'s float32 matrix-product weights as int8 with per-channel scales, in place; how many."""
    import openvino as ov
    from openvino import opset13

    compressed = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        weight = op.input_value(1).get_node()
        if weight.get_type_name() != "Constant":
            continue
        values = weight.get_data()
        if values.dtype != np.float32 or values.ndim != 2:
            continue
        reduced = 1 if op.get_transpose_b() else 0  # the input axis: one scale per output channel
        scale = np.abs(values).max(axis=reduced, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        quantized = np.clip(np.round(values / scale), -127, 127).astype(np.int8)
        decompressed = opset13.multiply(
            opset13.convert(opset13.constant(quantized), ov.Type.f32), opset13.constant(scale.astype(np.float32))
        )
        op.input(1).replace_source_output(decompressed.output(0))
        compressed += 1
    model.validate_nodes_and_infer_types()
    return compressed


def quantize(folder: Path, original: Path) -> int:
    """``folder``'s IR moved to ``original``, then written again with int8 weights; the products compressed."""
    import openvino as ov

    original.mkdir(parents=True, exist_ok=True)
    for name in (IR_FILE, IR_WEIGHTS):
        shutil.move(folder / name, original / name)
    model = ov.Core().read_model(str(original / IR_FILE))
    count = compress_int8(model)
    ov.save_model(model, str(folder / IR_FILE), compress_to_fp16=False)
    return count


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
