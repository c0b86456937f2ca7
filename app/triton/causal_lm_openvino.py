"""The ``text_generation`` family's continuous batching on OpenVINO GenAI (``[export] engine =
"openvino"``, ``app.core.causal_lm_contract``): one thread steps GenAI's ``ContinuousBatchingPipeline``
over the version folder's stateful IR, and sends each request's tokens to its sink as they are made.

It takes the requests ``causal_lm_scheduler.Scheduler`` takes (the same ``Request`` and sinks, the
same checks, counts and endings), so the Triton model runs either. What GenAI does here, that the
ONNX Runtime loop does not: paged attention (a row's keys and values in blocks of a cache allocated
once, ``kv_cache_gb``), a prefix cache (a prompt that starts as an earlier one did, a conversation's
next turn or a shared system prompt, reuses the blocks already computed for that start), a step
bounded by tokens as well as rows (``max_batched_tokens``: a long prompt is run in parts beside the
running rows), and its CPU kernels.

What differs from the ONNX Runtime loop: a sampled request draws from GenAI's own random generator,
seeded by the request's ``seed`` (the same seed, the same tokens, whoever it is batched with), not
from torch's, so a seeded draw is not ``generate``'s; greedy rows are ``generate``'s token for
token (float32: ``PRECISE``), and their log-probabilities those of the logits' log-softmax. Beam
search runs ``generate`` over ``decoder.onnx`` beside the pipeline (``causal_lm_beams``), as with the
ONNX Runtime loop.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.causal_lm_contract import (
    CACHE_GB_PARAMETER,
    LOGIT_BIAS,
    MAX_RUNNING_ROWS,
    NO_SEED,
    OPENVINO_NEUTRAL,
    PRECISE,
    STOP_TOKEN_IDS,
    cache_bytes_per_token,
    cache_gb,
    cache_tokens,
    context_length,
)
from app.triton.causal_lm_loop import Loop
from app.triton.causal_lm_requests import Cancelled, Late, Refused, Request
from app.triton.causal_lm_session import Graph

LOG = logging.getLogger(__name__)


def ending(config, ends: frozenset[int] | tuple[int, ...]) -> None:
    """A generation ends at any of ``ends``, or, with none, at ``max_new_tokens`` only. GenAI wants its
    ``eos_token_id`` among its stop ids, and one that is not negative even where it is ignored."""
    if ends:
        config.eos_token_id = min(ends)
        config.stop_token_ids = set(ends)
    else:
        config.ignore_eos, config.eos_token_id, config.stop_token_ids = True, 0, {0}


def generation_config(settings, ends: frozenset[int]):
    """GenAI's ``GenerationConfig`` of a request's settings (greedy or multinomial sampling; its
    repetition penalty; the folder's end-of-sequence ids; the chosen token's log-probability)."""
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = int(settings["max_new_tokens"])
    config.min_new_tokens = int(settings["min_new_tokens"])
    config.repetition_penalty = float(settings["repetition_penalty"])
    config.logprobs = 1  # GenAI leaves a greedy token's log-probability 0 unless it is asked for
    ending(config, ends)
    if settings.get(STOP_TOKEN_IDS):
        config.stop_token_ids = set(config.stop_token_ids) | set(settings[STOP_TOKEN_IDS])
    if settings["ignore_eos"]:
        config.ignore_eos = True
    if settings["do_sample"]:
        config.do_sample = True
        config.temperature = float(settings["temperature"])
        config.top_p = float(settings["top_p"])
        if int(settings["top_k"]) > 0:  # 0: no top-k (GenAI's default is none)
            config.top_k = int(settings["top_k"])
        seed = int(settings["seed"])
        config.rng_seed = random.SystemRandom().randrange(2**32) if seed == NO_SEED else seed
    return config


def sized_cache(folder: Path, sequence_length: int | None, given: int) -> int:
    """``kv_cache_gb``: ``given`` (config.pbtxt) where it holds one row of the whole context (the
    folder's positions, or model.toml's ``sequence_length`` where less), ``ValueError`` naming what
    fits where it does not; not given (0), ``cache_gb``'s default."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    per_token = cache_bytes_per_token(config)
    context = min(n for n in (context_length(config), sequence_length) if n)
    needed = cache_gb(per_token, context)
    held = cache_tokens(given, per_token)
    if given and held < context:
        raise ValueError(
            f"{CACHE_GB_PARAMETER} {given} holds {held:,} tokens of this model's key/value cache ({per_token:,} bytes "
            f"a token), under its context of {context:,}: set it to {needed}, or [preprocess] sequence_length to {held}"
        )
    return given or needed


def open_pipeline(version: Path, threads: int, cache_gb: int, batched_tokens: int, max_rows: int, precision=PRECISE):
    """GenAI's pipeline over ``version``'s IR on the CPU, with a prefix cache, computing with OpenVINO's
    ``precision`` properties (float32 unless model.toml's ``[export] precision`` says bf16)."""
    import openvino_genai

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.cache_size = max(1, cache_gb)
    scheduler.enable_prefix_caching = True
    scheduler.max_num_batched_tokens = batched_tokens
    scheduler.max_num_seqs = max_rows
    properties = dict(precision, **({"INFERENCE_NUM_THREADS": threads} if threads else {}))
    return openvino_genai.ContinuousBatchingPipeline(str(version), scheduler, "CPU", properties)


@dataclass(eq=False)
class Running:
    """A request in the pipeline: its handle and how many tokens it has been sent."""

    request: Request
    handle: object
    made: int = 0


class OpenVinoScheduler(Loop):
    """Continuous batching on GenAI's pipeline (``causal_lm_loop.Loop``: the queue, the checks, beam
    search beside, the endings). ``pipeline``: ``open_pipeline``'s; ``graph``: ``decoder.onnx``, for
    beam search only, or what opens it at the first beam search (its weights are not held twice until
    one is asked for). At most ``max_rows`` requests are in the pipeline at once, the others wait in
    order in the loop's queue: GenAI's own ``max_num_seqs`` bounds nothing under its dynamic split-fuse
    scheduling (the default), where only tokens and cache blocks limit a step."""

    thread_name = "openvino-steps"

    def __init__(
        self,
        folder: Path,
        pipeline,
        graph: Graph | Callable[[], Graph],
        max_rows: int = MAX_RUNNING_ROWS,
        clock=time.monotonic,
        **loop,
    ):
        super().__init__(folder, graph, max_rows, clock, **loop)
        self.pipeline = pipeline
        self.running: dict[int, Running] = {}
        self.ids = 0
        self.show: Callable[[str, float], None] | None = None  # the gauges of Triton's metrics, after each step

    def turn(self, block: bool = True) -> bool:
        """Newcomers handed to the pipeline, one step of it, every row's new tokens sent; waits for a
        request while nothing runs (``block``); False once closing."""
        taken = self._newcomers(len(self.running), block)
        if taken is None:
            return False
        try:
            for request in taken:
                self._add(request)
            self._drop_ended()
            if self.running:
                began = self.clock()
                self.pipeline.step()
                self.counts["steps"] += 1
                for row in list(self.running.values()):
                    self._send(row, began)
            self._show()  # also once the last rows left without a step (cancelled, late)
        except Exception as error:  # the running rows fail; the loop lives on
            LOG.exception("generation step failed")
            for row in list(self.running.values()):
                self._cancel(row, error, "failed")
        return True

    def _show(self) -> None:
        """Running and waiting requests, and the cache's use, as GenAI's pipeline says them."""
        if self.show is None:
            return
        found = self.pipeline.get_metrics()
        with self.condition:
            queued = len(self.waiting)
        running = min(found.scheduled_requests, len(self.running))
        self.show("running", running)
        self.show("waiting", len(self.running) - running + queued)
        self.show("kv_cache_usage", found.cache_usage / 100.0)  # GenAI says it in percent

    def check(self, request: Request) -> None:
        """The loop's check, and the settings GenAI does not take as the onnxruntime engine does
        (``OPENVINO_NEUTRAL``, at anything but their neutral value): ``Refused``."""
        super().check(request)
        if request.settings.get(LOGIT_BIAS):
            raise Refused(f"{LOGIT_BIAS}: the openvino engine takes none (the onnxruntime engine does)")
        for name, neutral in OPENVINO_NEUTRAL.items():
            if request.settings[name] != neutral:
                raise Refused(
                    f"{name}: the openvino engine takes only {neutral:g} (the onnxruntime engine takes others)"
                )

    def constrained(self, request: Request) -> Request:
        """A grammar is not followed here: GenAI's structured output needs a tokenizer it can read the
        vocabulary of, which a pipeline fed token ids has not (``Refused``; the router refuses first)."""
        if request.grammar is not None:
            raise Refused("grammar: the openvino engine follows no grammar (the onnxruntime engine does)")
        return request

    def _add(self, request: Request) -> None:
        import openvino as ov

        self.ids += 1
        ids = ov.Tensor(np.asarray(request.ids, np.int64)[None])
        handle = self.pipeline.add_request(self.ids, ids, generation_config(request.settings, self.ends))
        self.running[self.ids] = Running(request, handle)

    def _drop_ended(self) -> None:
        """Rows past their deadline or whose caller went away leave the pipeline before its step."""
        now = self.clock()
        for row in list(self.running.values()):
            if row.request.deadline <= now:
                self._cancel(row, Late(row.made), "late")
            elif self._cancelled(row.request, ending=False):
                self._cancel(row, Cancelled("cancelled by its caller"), "cancelled")

    def _send(self, row: Running, began: float) -> None:
        """The row's tokens of the step that ``began`` then, the last one flagged where GenAI says the
        request ended."""
        if not row.handle.can_read():
            return
        if not row.made:
            self._started(row.request, began)
        (output,) = row.handle.read().values()
        tokens, logprobs = list(output.generated_ids), list(output.generated_log_probs)
        ended = output.finish_reason.name != "NONE"
        for i, (token, logprob) in enumerate(zip(tokens, logprobs)):
            last = ended and i == len(tokens) - 1
            row.made += 1
            try:
                row.request.sink.token(int(token), float(logprob), last)
            except Exception:  # a stream that cannot take its token ends; the others go on
                LOG.exception("sending a token failed")
                self._cancel(row, None, "failed")
                return
        if ended:
            self.running = {key: value for key, value in self.running.items() if value is not row}
            self.counts["finished"] += 1

    def _cancel(self, row: Running, error: Exception | None, count: str) -> None:
        """The row leaves the pipeline (its blocks freed) and its sink is told ``error``."""
        self.running = {key: value for key, value in self.running.items() if value is not row}
        try:
            row.handle.cancel()
        except Exception:  # already ended inside the pipeline
            LOG.debug("cancelling a finished request", exc_info=True)
        if error is None:
            self.counts[count] += 1
        else:
            self._end(row.request, error, count)

    def _end_all(self, error: Exception, count: str) -> None:
        """Closing: every running and waiting request fails with ``error``."""
        for row in list(self.running.values()):
            self._cancel(row, error, count)
        self._end_waiting(error, count)
