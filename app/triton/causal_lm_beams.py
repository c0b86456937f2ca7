"""Beam search for the ``text_generation`` scheduler: Hugging Face's own ``generate`` over the same
``decoder.onnx`` (``OnnxCausalLM``), one request at a time on a thread of its own (``BeamSearch``).

Why ``generate`` and not a beam search written into the step loop: beam search's answer is defined
by ``generate`` (its candidates of twice the beams, length penalty, early stopping, end-of-sequence
bookkeeping), and the family's promise is ``generate``'s tokens; over the graph it gives them token
for token. Why its own thread: a search of 20 tokens is 21 runs of the graph; between two of them
the step loop runs one step of the batch (``causal_lm_session.Turns``), so streamed requests keep
moving while a search runs, each step slower by one beam step. Beam requests wait for one another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, GenerationMixin, PreTrainedModel, StoppingCriteria
from transformers.modeling_outputs import CausalLMOutputWithPast

from app.triton.causal_lm_requests import Cancelled, Closed, Counts, Late, Request
from app.triton.causal_lm_session import Graph

LOG = logging.getLogger(__name__)
ENDINGS = {Late: "late", Cancelled: "cancelled", Closed: "closed"}


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


class BeamSearch:
    """Beam-search requests (``num_beams`` > 1), answered whole, in the order they came."""

    def __init__(self, model: OnnxCausalLM, clock=time.monotonic) -> None:
        self.model = model
        self.clock = clock
        self.closing = threading.Event()
        self.waiting: deque[Request] = deque()
        self.condition = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="beam-search", daemon=True)
        self.counts = Counts(("finished", "failed", *ENDINGS.values()))

    def start(self) -> None:
        self.thread.start()

    def submit(self, request: Request) -> None:
        with self.condition:
            if self.closing.is_set():
                raise Closed("the model is unloading")
            self.waiting.append(request)
            self.condition.notify()

    def close(self) -> None:
        with self.condition:
            self.closing.set()
            self.condition.notify()
        if self.thread.is_alive():
            self.thread.join()
        for request in self.waiting:
            request.sink.failed(Closed("the model is unloading"))

    def _loop(self) -> None:
        while True:
            with self.condition:
                self.condition.wait_for(lambda: self.waiting or self.closing.is_set())
                if self.closing.is_set():
                    return
                request = self.waiting.popleft()
            try:
                self._answer(request)
            except Exception as error:  # answered to that request; the thread lives on
                LOG.exception("beam search failed")
                self.counts["failed"] += 1
                request.sink.failed(error)

    def _answer(self, request: Request) -> None:
        stop = Stop(request, self.closing, self.clock)
        ids = torch.from_numpy(np.asarray(request.ids, np.int64))[None]
        config = self.model.generation_config
        with torch.no_grad():
            found = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                num_beams=int(request.settings["num_beams"]),
                max_new_tokens=int(request.settings["max_new_tokens"]),
                repetition_penalty=float(request.settings["repetition_penalty"]),
                do_sample=False,  # beam search does not sample (the contract: sampling settings are not read)
                num_return_sequences=1,
                pad_token_id=pad_id(config),
                return_dict_in_generate=True,
                output_scores=True,
                stopping_criteria=[stop],
            )
        if stop.why is not None:
            self.counts[ENDINGS[type(stop.why)]] += 1
            request.sink.failed(stop.why)
            return
        scores = self.model.compute_transition_scores(found.sequences, found.scores, found.beam_indices)
        tokens = found.sequences[0, ids.shape[1] :]
        self.counts["finished"] += 1
        request.sink.sequence(tokens.tolist(), scores[0, : len(tokens)].tolist())
