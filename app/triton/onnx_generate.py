"""Hugging Face's ``generate`` over ONNX Runtime: an encoder-decoder model whose forward runs the
three graphs model preparation exports (``app.core.generation_contract``), so that ``GenerationMixin`` drives
the search (greedy, beam), the stopping rules and the logits processors (penalties, n-gram blocking,
forced tokens) exactly as it drives the PyTorch model. No generation loop is written here.

- ``get_encoder()`` runs ``encoder.onnx``: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``.
- ``forward`` runs ``decoder_init.onnx`` on the first step (an empty cache): the decoder's input ids,
  the encoder's states and mask -> the logits, and each layer's self-attention keys and values and
  cross-attention keys and values, which go into ``generate``'s ``EncoderDecoderCache``; on later steps
  ``decoder_step.onnx``: the step's ids, the mask and the cache -> the logits and the step's own
  self-attention keys and values, appended to the cache. Beam search reorders the cache itself.

Needs torch (``generate`` works on torch tensors only) and transformers: it runs inside Triton's
python backend (``app/triton/text2text_model.py``), in model preparation's checks and in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, GenerationConfig, GenerationMixin, PreTrainedModel, StoppingCriteria
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from app.core.generation_contract import DECODER_INIT_FILE, DECODER_STEP_FILE, ENCODER_FILE, PAD, read_generation_config

# The tensor names of the exported graphs (scripts/model_prep/generation_export.py writes them).
ENCODER_INPUTS = ("input_ids", "attention_mask")
HIDDEN = "encoder_hidden_states"
DECODER_INPUTS = ("decoder_input_ids", HIDDEN, "encoder_attention_mask")
LOGITS = "logits"
KINDS = (("self", "key"), ("self", "value"), ("cross", "key"), ("cross", "value"))


def cache_names(layers: int, prefix: str, kinds: Sequence[tuple[str, str]] = KINDS) -> list[str]:
    """``<prefix>.self.0.key``, ``<prefix>.self.0.value``, ``<prefix>.cross.0.key``, ... layer by layer."""
    return [f"{prefix}.{attention}.{layer}.{part}" for layer in range(layers) for attention, part in kinds]


def session_options(threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


class OnnxEncoder(nn.Module):
    """The encoder graph, as ``generate`` calls an encoder (keyword arguments, a ``BaseModelOutput``)."""

    main_input_name = "input_ids"

    def __init__(self, session) -> None:
        super().__init__()
        self.session = session

    def forward(self, input_ids=None, attention_mask=None, **_: Any) -> BaseModelOutput:
        feed = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        (hidden,) = self.session.run(None, feed)
        return BaseModelOutput(last_hidden_state=torch.from_numpy(hidden))


class OnnxSeq2SeqLM(PreTrainedModel, GenerationMixin):
    """An encoder-decoder LM whose forward is ONNX Runtime; ``generate`` is Hugging Face's own."""

    main_input_name = "input_ids"
    base_model_prefix = "onnx"
    _supports_cache_class = True

    def __init__(self, folder: Path, onnx_folder: Path, threads: int = 0, providers: Sequence[str] = ()) -> None:
        import onnxruntime as ort

        super().__init__(AutoConfig.from_pretrained(str(folder)))
        available = ort.get_available_providers()
        chosen = [p for p in providers if p in available] or ["CPUExecutionProvider"]

        def session(name: str):
            return ort.InferenceSession(str(onnx_folder / name), session_options(threads), providers=chosen)

        self.encoder = OnnxEncoder(session(ENCODER_FILE))
        self.first, self.later = session(DECODER_INIT_FILE), session(DECODER_STEP_FILE)
        self.first_inputs = [i.name for i in self.first.get_inputs()]
        self.later_inputs = [i.name for i in self.later.get_inputs()]
        self.layers = (len(self.first.get_outputs()) - 1) // len(KINDS)
        self.generation_config = generation_config(folder)
        # generate() reads the model's device and dtype from its parameters: one, never used
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.eval()

    def get_encoder(self, *_: Any, **__: Any) -> nn.Module:
        return self.encoder

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        encoder_outputs=None,
        past_key_values=None,
        use_cache: bool = True,
        **_: Any,
    ) -> Seq2SeqLMOutput:
        feed = {
            "decoder_input_ids": decoder_input_ids.numpy(),
            HIDDEN: encoder_outputs[0].numpy(),
            "encoder_attention_mask": attention_mask.numpy(),
        }
        if past_key_values.get_seq_length() == 0:
            found = self.first.run(None, {name: feed[name] for name in self.first_inputs})
            for layer in range(self.layers):
                self_key, self_value, cross_key, cross_value = (
                    torch.from_numpy(a) for a in found[1 + 4 * layer : 5 + 4 * layer]
                )
                past_key_values.self_attention_cache.update(self_key, self_value, layer)
                past_key_values.cross_attention_cache.update(cross_key, cross_value, layer)
                past_key_values.is_updated[layer] = True
        else:
            for layer in range(self.layers):
                own = past_key_values.self_attention_cache.layers[layer]
                cross = past_key_values.cross_attention_cache.layers[layer]
                for (attention, part), tensor in zip(KINDS, (own.keys, own.values, cross.keys, cross.values)):
                    feed[f"past.{attention}.{layer}.{part}"] = tensor.numpy()
            found = self.later.run(None, {name: feed[name] for name in self.later_inputs})
            for layer in range(self.layers):
                key, value = (torch.from_numpy(a) for a in found[1 + 2 * layer : 3 + 2 * layer])
                past_key_values.self_attention_cache.update(key, value, layer)
        return Seq2SeqLMOutput(logits=torch.from_numpy(found[0]), past_key_values=past_key_values)


def generation_config(folder: Path) -> GenerationConfig:
    """What ``from_pretrained`` gives a model of the folder: its generation_config.json, else the
    generation settings of its config.json (a folder saved before generation configs existed)."""
    if (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(str(folder))
    known = GenerationConfig().to_dict()
    return GenerationConfig.from_dict({k: v for k, v in read_generation_config(folder).items() if k in known})


class Deadlines(StoppingCriteria):
    """Ends the generation of each text whose deadline (``time.monotonic()``) has passed, and only
    those: the others of the batch go on as if it were not there (each beam of a text stops)."""

    def __init__(self, deadlines: Sequence[float], clock) -> None:
        self.deadlines = torch.tensor(list(deadlines), dtype=torch.float64)
        self.clock = clock
        self.passed = torch.zeros(len(deadlines), dtype=torch.bool)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **_: Any) -> torch.BoolTensor:
        self.passed |= self.deadlines <= self.clock()
        per_text = input_ids.shape[0] // len(self.deadlines)  # beams of a text are consecutive rows
        return self.passed.repeat_interleave(per_text)


def trimmed(sequence: np.ndarray, ends: Sequence[int]) -> np.ndarray:
    """A text's row of a batched ``generate``: what it returns for that text alone (up to and
    including the first end-of-sequence token after the decoder's start; the padding after it dropped)."""
    stops = np.flatnonzero(np.isin(sequence[1:], list(ends)))
    return sequence[: stops[0] + 2] if len(stops) else sequence


def padded(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Rows of different lengths as one ``[rows, longest]`` array, ``PAD`` after each row's end."""
    out = np.full((len(rows), max(len(r) for r in rows)), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
