"""A ``text_generation`` model for OpenVINO GenAI's continuous batching (``[export] engine =
"openvino"``, ``app.core.causal_lm_contract``): the folder's PyTorch model converted to one stateful
OpenVINO IR (``openvino_model.xml`` and its weights, ``.bin``), as optimum-intel shapes it, without
optimum-intel (it pins transformers below the project's), then checked against ``generate``.

The IR, as GenAI's ``ContinuousBatchingPipeline`` reads it:

- ``ov.convert_model`` of ``Step``: the model with SDPA attention (``attn_implementation="sdpa"``:
  each layer's attention is one ``ScaledDotProductAttention`` op, which GenAI's paged attention
  replaces), every layer's past keys and values in (``past_key_values.<i>.key``/``.value``), the
  logits of every position and the grown keys and values out (``present.<i>.key``/``.value``);
- a ``beam_idx`` input gathering the cache's rows, then the cache made the model's state
  (``apply_make_stateful_transformation``), each state initialised with zeros of the batch's size.

The check (printed by preparation): the checked prompts' greedy tokens from the pipeline, on the CPU in
float32 (``PRECISE``: no bf16 arithmetic, no compressed cache), equal to ``generate``'s token for
token.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core.causal_lm_contract import (
    CACHE_GB_PARAMETER,
    GIB,
    IR_FILE,
    MIN_AGREEMENT_KEY,
    PRECISE,
    PRECISION_KEY,
    PRECISIONS,
    WEIGHTS_KEY,
    cache_bytes_per_token,
    cache_gb,
    cache_layout,
    cache_tokens,
    context_length,
)
from app.triton.causal_lm_openvino import ending
from scripts.model_prep import causal_lm_checks as checks

# The IR's tensor names, as optimum-intel writes them (GenAI's transformations find the cache by them).
INPUTS = ("input_ids", "attention_mask", "position_ids")
BEAM_IDX = "beam_idx"


def cache_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


class Step(nn.Module):
    """The model over flat cache tensors, every position's logits out (what the IR is converted from).
    The cache's layers are given their past directly: ``DynamicCache``'s own first update concatenates
    onto an empty 1-D tensor, which OpenVINO's converter refuses."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache()
        for i in range(self.layers):
            key, value = past[2 * i], past[2 * i + 1]
            cache.update(key[:, :, :0], value[:, :, :0], i)
            cache.layers[i].keys, cache.layers[i].values = key, value
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        flat = []
        for layer in out.past_key_values.layers[: self.layers]:
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def convert(model: nn.Module, folder: Path) -> None:
    """``model`` (eval mode) as the stateful IR ``folder / IR_FILE``; its attention is SDPA while it is
    traced, then what it was."""
    import openvino as ov

    from scripts.model_prep import causal_lm_graph

    layers = causal_lm_graph.layers_of(model)
    kv_heads, head_dim = causal_lm_graph.cache_shape(model)
    sample = causal_lm_graph.sample_inputs(model, past=3, new=4)
    attention = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it fixes
            converted = ov.convert_model(Step(model, layers).eval(), example_input=sample)
    finally:
        model.set_attn_implementation(attention)
        model.eval()
    past, present = cache_names(layers, "past_key_values"), cache_names(layers, "present")
    for port, name in zip(converted.inputs, [*INPUTS, *past]):
        port.get_tensor().set_names({name})
        rank = len(port.get_partial_shape())
        port.get_node().set_partial_shape(ov.PartialShape([-1, -1] if rank == 2 else [-1, kv_heads, -1, head_dim]))
    for port, name in zip(converted.outputs, ["logits", *present]):
        port.get_tensor().set_names({name})
    converted.validate_nodes_and_infer_types()
    make_stateful(converted, past, present)
    ov.save_model(converted, str(folder / IR_FILE), compress_to_fp16=False)


def make_stateful(converted, past: list[str], present: list[str]) -> None:
    """The cache as the model's state: ``beam_idx`` gathers its rows, each ``past`` input becomes a
    state read (zeros of the batch's size at first) and each ``present`` output its write."""
    import openvino as ov
    from openvino import opset13
    from openvino._offline_transformations import apply_make_stateful_transformation

    beams = opset13.parameter(name=BEAM_IDX, dtype=ov.Type.i32, shape=ov.PartialShape([-1]))
    beams.output(0).get_tensor().add_names({BEAM_IDX})
    converted.add_parameters([beams])
    for name in past:
        port = converted.input(name)
        readers = port.get_target_inputs()
        gathered = opset13.gather(port, beams, opset13.constant(0))
        for reader in readers:
            reader.replace_source_output(gathered.output(0))
    converted.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(converted, dict(zip(past, present)))
    shape = opset13.shape_of(converted.input(INPUTS[0]), output_type="i64")
    batch = opset13.gather(shape, opset13.constant([0]), opset13.constant(0))
    for op in converted.get_ops():
        if op.get_type_name() == "ReadValue":
            dims = [dim.min_length for dim in op.get_output_partial_shape(0)]
            dims[0] = batch
            parts = [opset13.constant(np.array([d], np.int64)) if isinstance(d, int) else d for d in dims]
            zeros = opset13.constant(0.0, dtype=op.get_output_element_type(0))
            op.set_arguments([opset13.broadcast(zeros, opset13.concat(parts, axis=0))])
    converted.validate_nodes_and_infer_types()


def pipeline(folder: Path):
    """GenAI's continuous-batching pipeline over ``folder``'s IR, on the CPU in float32 (``PRECISE``)."""
    import openvino_genai

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.cache_size = 1  # GB of key/value cache: the check's two prompts need a fraction of it
    return openvino_genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", dict(PRECISE))


def greedy(folder: Path, prompts: list[list[int]], new_tokens: int, ends: tuple[int, ...]) -> list[list[int]]:
    """Each prompt's greedy tokens from the pipeline, up to and including its first end-of-sequence id."""
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = new_tokens
    config.logprobs = 1
    ending(config, ends)
    found = pipeline(folder).generate([ov.Tensor(np.array([p], np.int64)) for p in prompts], [config] * len(prompts))
    return checks.cut([result.m_generation_ids[0] for result in found], ends)


def unsupported(config: dict) -> str | None:
    """Why the engine cannot answer as ``generate`` for a folder of this ``config.json``, or None:
    sliding-window attention narrower than the context (GenAI's paged attention would attend to all)."""
    window, positions = config.get("sliding_window"), config.get("max_position_embeddings")
    if isinstance(window, int) and isinstance(positions, int) and window < positions:
        return (
            f"sliding-window attention (sliding_window {window} of its {positions} positions): OpenVINO GenAI's "
            f'paged attention would attend to the whole context; serve it with [export] engine = "onnxruntime"'
        )
    return None


def prepare(
    spec, model: nn.Module, folder: Path, seed: int, want: list[list[int]], step, weights: str, precision: str = "fp32"
) -> dict:
    """The IR into ``folder`` beside the checked graph, then its greedy tokens for the ONNX check's
    prompts (each alone, unpadded) held to ``want``, ``generate``'s; with int8 or int4 ``weights``, quantized
    and held to the float32 IR (``quantized``). A failure is the one-line refusal. What the report keeps."""
    with step(spec.name, "converting the model to a stateful OpenVINO IR (SDPA attention, the cache as state)"):
        try:
            convert(model, folder)
        except Exception as error:  # noqa: BLE001 - the converter's failures have no one type
            raise checks.refusal(spec, f"its conversion to OpenVINO failed ({checks.first_line(error)})") from None
    with step(spec.name, "checking the IR (OpenVINO GenAI's continuous batching, float32, greedy vs generate)"):
        ends, pad = checks.end_ids(spec, model)
        ids, mask = checks.prompts(model, pad, seed)
        prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
        try:
            got = greedy(folder, prompts, checks.CHECK_NEW_TOKENS, ends)
        except RuntimeError as error:
            raise checks.refusal(spec, f"OpenVINO GenAI cannot run its IR ({checks.first_line(error)})") from None
        if got != want:
            raise checks.refusal(spec, f"its OpenVINO IR does not equal generate (tokens {got} against {want})")
    lowered = weights != "fp32" or precision != "fp32"
    return {
        WEIGHTS_KEY: weights,
        PRECISION_KEY: precision,
        **cache_line(spec),
        **(quantized(spec, folder, step, weights, precision) if lowered else {}),
    }


def cache_line(spec) -> dict:
    """What the key/value cache of one token and of the whole context take, and the kv_cache_gb the
    served model defaults to, printed; the bytes a token kept in the report."""
    config = json.loads((spec.text.folder / "config.json").read_text(encoding="utf-8"))
    per_token = cache_bytes_per_token(config)
    context = min(n for n in (context_length(config), spec.text.sequence_length) if n)
    gb = cache_gb(per_token, context)
    layers, kv_heads, head_dim = cache_layout(config)
    print(
        f"[{spec.name}] key/value cache: {per_token:,} bytes a token ({layers} layers x {kv_heads} heads x "
        f"{head_dim} x keys and values x float32); the {context:,}-token context takes "
        f"{per_token * context / GIB:.2f} GB a row: {CACHE_GB_PARAMETER} {gb} by default, "
        f"{cache_tokens(gb, per_token):,} tokens",
        flush=True,
    )
    return {"kv_cache_bytes_per_token": per_token, "kv_cache_gb": gb}


QUANTIZED_AS = {"int8": "per output channel", "int4": "in groups of inputs, the head int8"}


def quantized(spec, folder: Path, step, weights: str = "int8", precision: str = "fp32") -> dict:
    """``folder``'s IR with int8 or int4 ``weights`` and/or run in bf16 ``precision``, refused where its
    greedy next tokens agree with the float32 IR's in float32 less than ``MIN_AGREEMENT`` (or its
    ``[export] min_agreement``); the agreement printed and kept in the report (keys named by what was
    lowered: ``int8_``, ``int4_``, ``bf16_``, ``int8_bf16_``, ``int4_bf16_``)."""
    from scripts.model_prep import causal_lm_quantize as quantize

    lowered = [part for part in (weights, precision) if part != "fp32"]
    what = " weights in ".join(lowered) + (" weights" if lowered == [weights] else " arithmetic")
    original = folder / "fp32" if weights != "fp32" else folder
    if weights != "fp32":
        with step(spec.name, f"quantizing the matrix products' weights to {weights} ({QUANTIZED_AS[weights]})"):
            quantize.quantize(folder, original, weights)
    with step(spec.name, f"checking {what} against float32 ({len(quantize.SENTENCES)} sentences, teacher-forced)"):
        prompts = quantize.encoded_sentences(spec.text.folder)
        continuations = greedy(original, prompts, quantize.CONTINUATION, ())
        found = quantize.agreement(original, folder, prompts, continuations, PRECISIONS[precision])
    if original != folder:
        shutil.rmtree(original)
    needed = checks.min_agreement(spec)
    said = f", [export] {MIN_AGREEMENT_KEY}" if MIN_AGREEMENT_KEY in spec.export else ""
    taken = f"at least {100 * needed:.0f}% taken{said}"
    print(f"[{spec.name}] {what}: {found.line()} ({taken})", flush=True)
    if found.ratio < needed:
        raise checks.refusal(spec, f"its {what} answer too far from float32: {found.line()}, under {100 * needed:.0f}%")
    label = "_".join(lowered)
    return {f"{label}_agreement": found.ratio, f"{label}_mean_abs_logprob_diff": found.mean_abs_logprob_diff}
