"""Hugging Face's ``generate`` over a ``text_generation`` model's ``decoder.onnx``: ``OnnxCausalLM``
(the graph as a ``PreTrainedModel``'s forward) and ``search``, one beam-search request. Imported by
``causal_lm_beams`` at the first beam-search request only: transformers' modelling and generation
modules cost a model's process about 3 s of CPU and 200 MB to import, which greedy search and
sampling do not need.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, GenerationMixin, PreTrainedModel, StoppingCriteria
from transformers.modeling_outputs import CausalLMOutputWithPast

from app.triton.causal_lm_requests import Cancelled, Closed, Late, Request
from app.triton.causal_lm_session import Graph


class OnnxCausalLM(PreTrainedModel, GenerationMixin):
    """A decoder-only LM whose forward is ``Graph``; ``generate`` is Hugging Face's own (its scores,
    its cache reordering, none written again here). The folder gives the config and the generation
    config, as ``from_pretrained`` would."""

    main_input_name = "input_ids"
    base_model_prefix = "onnx"
    _supports_cache_class = True

    def __init__(self, folder: Path, graph: Graph) -> None:
        from app.triton.onnx_generate import generation_config

        super().__init__(AutoConfig.from_pretrained(str(folder)))
        self.graph = graph
        self.generation_config = generation_config(folder)
        # generate() reads the model's device and dtype from its parameters: one, never used
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.eval()

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **_: Any) -> CausalLMOutputWithPast:
        past = past_key_values.get_seq_length()
        if attention_mask is None:
            attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.int64)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        if past:
            layers = past_key_values.layers[: self.graph.layers]
            cache = [tensor.numpy() for layer in layers for tensor in (layer.keys, layer.values)]
        else:
            cache = self.graph.empty(input_ids.shape[0])
        logits, present = self.graph.run(input_ids.numpy(), attention_mask.numpy(), positions.numpy(), cache)
        for layer in range(self.graph.layers):
            key, value = (torch.from_numpy(a[:, :, past:]) for a in present[2 * layer : 2 * layer + 2])
            past_key_values.update(key, value, layer)
        return CausalLMOutputWithPast(logits=torch.from_numpy(logits)[:, None, :], past_key_values=past_key_values)


def pad_id(config) -> int:
    """What ``generate`` pads finished beams with: the pad token, else the (first) end-of-sequence
    token, as ``generate`` defaults it (given here, so that it does not log that it did)."""
    for value in (config.pad_token_id, config.eos_token_id):
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int):
            return value
    return 0


class Stop(StoppingCriteria):
    """Ends a search whose request passed its deadline, was cancelled, or whose model is closing;
    ``why`` says which."""

    def __init__(self, request: Request, closing: threading.Event, clock) -> None:
        self.request, self.closing, self.clock = request, closing, clock
        self.why: Exception | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **_: Any) -> torch.BoolTensor:
        if self.why is None:
            made = input_ids.shape[1] - len(self.request.ids)
            if self.closing.is_set():
                self.why = Closed("the model is unloading")
            elif self.clock() >= self.request.deadline:
                self.why = Late(made)
            elif self.request.sink.cancelled():
                self.why = Cancelled("cancelled by its caller")
        return torch.full((input_ids.shape[0],), self.why is not None, dtype=torch.bool)


def search(model: OnnxCausalLM, request: Request, closing: threading.Event, clock) -> tuple[list[int], list[float]]:
    """One request's beam search: its new tokens and each one's score, as ``generate`` and
    ``compute_transition_scores`` give them; raises why it stopped early (``Late``, ``Cancelled``,
    ``Closed``)."""
    stop = Stop(request, closing, clock)
    ids = torch.from_numpy(np.asarray(request.ids, np.int64))[None]
    config = model.generation_config
    with torch.no_grad():
        found = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            num_beams=int(request.settings["num_beams"]),
            max_new_tokens=int(request.settings["max_new_tokens"]),
            min_new_tokens=int(request.settings["min_new_tokens"]),
            repetition_penalty=float(request.settings["repetition_penalty"]),
            do_sample=False,  # beam search does not sample (the contract: sampling settings are not read)
            num_return_sequences=1,
            pad_token_id=pad_id(config),
            return_dict_in_generate=True,
            output_scores=True,
            stopping_criteria=[stop],
        )
    if stop.why is not None:
        raise stop.why
    scores = model.compute_transition_scores(found.sequences, found.scores, found.beam_indices)
    tokens = found.sequences[0, ids.shape[1] :]
    return tokens.tolist(), scores[0, : len(tokens)].tolist()
