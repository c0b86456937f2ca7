"""Triton python-backend model of a ``text_generation`` model: continuous batching over the version
folder's ``decoder.onnx`` (``app.triton.causal_lm_scheduler``), each token streamed as it is made.

Copied as ``<model>/1/model.py`` by model preparation. The model is decoupled and ``max_batch_size``
is 0 (``app.core.causal_lm_contract``): ``execute`` gets requests of one prompt each, checks their
values, hands each to the scheduler with its response sender and returns at once; the scheduler's
thread sends every token as one response of the request's stream, the last with Triton's final flag,
and ends the stream of a request that failed (deadline, error) with an error response. A caller that
cancels (``response_sender.is_cancelled()``, asked every step) has its row dropped at the next step.

Triton's own metrics (its metrics port, ``/metrics``) carry how the model's requests ended,
``text_generation_requests_total{model, outcome}`` (``finished``, ``cancelled``, ``late``, ``failed``,
and ``busy``: refused on arrival, the waiting queue full), ``text_generation_steps_total{model}``, the
batch steps run, ``text_generation_shared_prompt_rows_total{model}``, the rows whose prompt another
row ran for them (``n`` choices, ``best_of``'s draws: ``causal_lm_scheduler``), and
``text_generation_queue_duration_seconds{model}``, a histogram of each request's
wait from its arrival to the start of the step that makes its first token: a cancelled caller is seen
there, in Triton, as well as on the router's ``router_generation_cancelled_total``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.core.causal_lm_contract import (
    ALTERNATIVE_IDS,
    ALTERNATIVE_LOGPROBS,
    BATCHED_TOKENS,
    BATCHED_TOKENS_PARAMETER,
    CACHE_GB_PARAMETER,
    GRAMMAR,
    GRAPH_FILE,
    INPUT_IDS,
    IR_FILE,
    LOGIT_BIAS,
    LOGIT_BIAS_IDS,
    LOGPROB,
    MAX_RUNNING_ROWS,
    MAX_TIMEOUT_MS,
    MAX_WAITING,
    PRECISION_KEY,
    PRECISIONS,
    PROMPT_ALTERNATIVE_IDS,
    PROMPT_ALTERNATIVE_LOGPROBS,
    PROMPT_LOGPROBS,
    RUNNING_ROWS_PARAMETER,
    SETTINGS,
    STOP_TOKEN_IDS,
    TOKEN_ID,
    WAITING_PARAMETER,
    defaults,
)
from app.core.generation_contract import TIMEOUT_MS, read_generation_config
from app.core.grammar import Grammar, GrammarError
from app.triton.causal_lm_requests import Busy, Cancelled, Closed, Late, Refused, Request
from app.triton.causal_lm_scheduler import Scheduler
from app.triton.causal_lm_session import Graph, open_session
from app.triton.responses import present

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # outside Triton (unit tests put a stand-in here)
    pb_utils = None

LOG = logging.getLogger(__name__)
PROVIDERS_PARAMETER = "ort_providers"  # ONNX Runtime's providers, by preference (the target's)
OUTCOMES = ("finished", "cancelled", "late", "failed", "busy")
# The queue-duration histogram's buckets (seconds): a step of a small model takes milliseconds, a long
# prompt's seconds; a wait of a minute is a queue that should have been refused earlier.
QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CANCEL_CHECK_S = 0.05  # a caller gone is seen within this (and the next step)
WARM_UP_S = 120.0
BIAS_TENSORS = ((LOGIT_BIAS_IDS, np.int64), (LOGIT_BIAS, np.float32))
PROMPT_OUTPUTS = (PROMPT_LOGPROBS, PROMPT_ALTERNATIVE_IDS, PROMPT_ALTERNATIVE_LOGPROBS)
EMPTY_PROMPT = (np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))


def read_request(
    arrays: Mapping[str, np.ndarray], given_defaults: Mapping[str, Any]
) -> tuple[np.ndarray, dict, float, Grammar | None]:
    """A request's prompt, settings (a setting it does not send: the folder's default; its logit biases
    and stop token ids among them, as tuples), timeout in seconds and grammar (none sent: None);
    ``Refused`` naming a tensor that is not one value, a timeout out of its bounds, or a grammar tensor
    that is not one."""
    settings = dict(given_defaults)
    for setting in SETTINGS:
        value = arrays.get(setting.name)
        if value is None:
            continue
        if value.size != 1:
            raise Refused(f"{setting.name} must be one value, not an array of shape {value.shape}")
        settings[setting.name] = bool(value.item()) if setting.dtype == "BOOL" else value.item()
    timeout = arrays.get(TIMEOUT_MS, np.array([MAX_TIMEOUT_MS]))
    if timeout.size != 1 or not 1 <= timeout.item() <= MAX_TIMEOUT_MS:
        raise Refused(f"{TIMEOUT_MS} must be one value from 1 to {MAX_TIMEOUT_MS}")
    if INPUT_IDS not in arrays:
        raise Refused(f"{INPUT_IDS} must be given")
    try:
        grammar = Grammar.decoded(np.asarray(arrays.get(GRAMMAR, ()), np.uint8).tobytes())
    except GrammarError as error:
        raise Refused(str(error)) from None
    ids, values = (np.asarray(arrays.get(name, ()), dtype).reshape(-1) for name, dtype in BIAS_TENSORS)
    if ids.shape != values.shape:
        raise Refused(f"{LOGIT_BIAS_IDS} and {LOGIT_BIAS} must be as long as each other")
    settings[LOGIT_BIAS] = tuple(zip(ids.tolist(), values.tolist()))
    settings[STOP_TOKEN_IDS] = tuple(np.asarray(arrays.get(STOP_TOKEN_IDS, ()), np.int64).reshape(-1).tolist())
    return np.asarray(arrays[INPUT_IDS], np.int64), settings, timeout.item() / 1000.0, grammar


class Stream:
    """A request's response sender as the scheduler's sink: one response a token, the first with the
    prompt's log-probabilities where they were asked (``prompt``), every other with them empty."""

    def __init__(self, sender, clock=time.monotonic) -> None:
        self.sender = sender
        self.clock = clock
        self.asked = float("-inf")  # when Triton was last asked whether the caller cancelled
        self.prompt_tensors: tuple[np.ndarray, ...] = EMPTY_PROMPT

    def prompt(self, logprobs: np.ndarray, alternatives: tuple[np.ndarray, np.ndarray]) -> None:
        ids, values = alternatives
        self.prompt_tensors = (
            np.asarray(logprobs, np.float32).reshape(-1),
            np.asarray(ids, np.int64).reshape(-1),
            np.asarray(values, np.float32).reshape(-1),
        )

    def token(self, token_id: int, logprob: float, last: bool, alternatives: Any = None) -> None:
        self._send([token_id], [logprob], last, alternatives)

    def sequence(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self._send(token_ids, logprobs, True)

    def _send(self, token_ids: Sequence[int], logprobs: Sequence[float], last: bool, alternatives: Any = None) -> None:
        ids, values = alternatives if alternatives is not None else ((), ())
        tensors = [
            pb_utils.Tensor(TOKEN_ID, np.asarray(token_ids, np.int64)),
            pb_utils.Tensor(LOGPROB, np.asarray(logprobs, np.float32)),
            pb_utils.Tensor(ALTERNATIVE_IDS, np.asarray(ids, np.int64).reshape(-1)),
            pb_utils.Tensor(ALTERNATIVE_LOGPROBS, np.asarray(values, np.float32).reshape(-1)),
            *(pb_utils.Tensor(name, array) for name, array in zip(PROMPT_OUTPUTS, self.prompt_tensors)),
        ]
        self.prompt_tensors = EMPTY_PROMPT
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)
        if last:
            self.sender = None  # done: Triton deleted its response factory with the final flag; never asked again

    def failed(self, error: Exception) -> None:
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self.sender.send(pb_utils.InferenceResponse(error=triton_error(error)), flags=flags)
        self.sender = None  # done: Triton deleted its response factory with the final flag; never asked again

    def cancelled(self) -> bool:
        """Whether the caller cancelled, asked of Triton at most every ``CANCEL_CHECK_S`` (each asking is a
        round trip from the stub to the server, and the scheduler asks for every row at every step)."""
        if self.sender is None:
            return False
        now = self.clock()
        if now - self.asked < CANCEL_CHECK_S:
            return False
        self.asked = now
        return bool(self.sender.is_cancelled())


def triton_error(error: Exception):
    """The Triton error of a request's failure: the caller's values (400), its deadline (the router's
    timeout), the model's unloading or its full queue (429), its cancellation, else the model's own
    failure (500)."""
    codes = pb_utils.TritonError
    if isinstance(error, Refused):
        return codes(str(error), codes.INVALID_ARG)
    if isinstance(error, (Late, Closed, Busy)):
        return codes(str(error), codes.UNAVAILABLE)
    if isinstance(error, Cancelled):
        return codes(str(error), getattr(codes, "CANCELLED", codes.UNAVAILABLE))
    return codes(f"generation failed: {error.__class__.__name__}: {error}")


class Waited:
    """The warm-up's sink: waits for its generation's end; its failure raised again."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Exception | None = None

    def token(self, token_id: int, logprob: float, last: bool, alternatives: Any = None) -> None:
        if last:
            self.done.set()

    def sequence(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self.done.set()

    def failed(self, error: Exception) -> None:
        self.error = error
        self.done.set()

    def cancelled(self) -> bool:
        return False

    def wait(self, timeout: float) -> None:
        if not self.done.wait(timeout):
            raise TimeoutError(f"the warm-up's generation did not end in {timeout:.0f} s")
        if self.error is not None:
            raise self.error


def updater(metrics: dict, families: tuple, how: str):
    """``(name, value)`` -> the named metric's ``how`` (``increment`` or ``set``) with ``value``; a
    metric never fails a generation. ``families`` stay referenced: a Metric outlives its MetricFamily
    only while the family is."""

    def update(name: str, value: float) -> None:
        metric = metrics.get(name)
        if metric is not None and families:
            try:
                getattr(metric, how)(value)
            except Exception:
                LOG.exception("%s of %s on Triton's metrics failed", how, name)

    return update


def triton_metrics(model: str):
    """What the scheduler's counts tell, as counters of Triton's metrics (None outside Triton, or where
    the python backend has no custom metrics)."""
    family = getattr(pb_utils, "MetricFamily", None)
    if family is None:
        return None
    ended = family(
        name="text_generation_requests_total",
        description="text_generation requests by how they ended: finished, cancelled (the caller went away), "
        "late (past the deadline), failed, busy (refused on arrival: the waiting queue full)",
        kind=family.COUNTER,
    )
    steps = family(name="text_generation_steps_total", description="Batch steps run", kind=family.COUNTER)
    shared = family(
        name="text_generation_shared_prompt_rows_total",
        description="Rows whose prompt another row ran for them (OpenAI's n, best_of): of their step, or running",
        kind=family.COUNTER,
    )
    counters = {outcome: ended.Metric(labels={"model": model, "outcome": outcome}) for outcome in OUTCOMES}
    counters["steps"] = steps.Metric(labels={"model": model})
    counters["shared"] = shared.Metric(labels={"model": model})
    return updater(counters, (ended, steps, shared), "increment")


def triton_queue_time(model: str):
    """Each request's wait for its first step, as a histogram of Triton's metrics (None outside
    Triton)."""
    family = getattr(pb_utils, "MetricFamily", None)
    if family is None or not hasattr(family, "HISTOGRAM"):
        return None
    waits = family(
        name="text_generation_queue_duration_seconds",
        description="text_generation requests' wait from their arrival to the start of the step that makes "
        "their first token",
        kind=family.HISTOGRAM,
    )
    histogram = waits.Metric(labels={"model": model}, buckets=list(QUEUE_BUCKETS))
    update = updater({"wait": histogram}, (waits,), "observe")
    return lambda seconds: update("wait", seconds)


def triton_gauges(model: str):
    """What the openvino engine's pipeline holds after each step, as gauges of Triton's metrics:
    requests running and waiting (in the pipeline for a row or for cache blocks, and not yet handed
    to it), and the share of its key/value cache in use (None outside Triton)."""
    family = getattr(pb_utils, "MetricFamily", None)
    if family is None:
        return None
    requests = family(
        name="text_generation_requests_now",
        description="text_generation requests running (stepped) and waiting (for a row, for cache blocks)",
        kind=family.GAUGE,
    )
    usage = family(
        name="text_generation_kv_cache_usage_ratio",
        description="The share of the engine's key/value cache in use (the openvino engine)",
        kind=family.GAUGE,
    )
    gauges = {state: requests.Metric(labels={"model": model, "state": state}) for state in ("running", "waiting")}
    gauges["kv_cache_usage"] = usage.Metric(labels={"model": model})
    return updater(gauges, (requests, usage), "set")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from app.triton.onnx_model import intra_op_threads, limit_torch_threads, volunteer_for_the_oom_killer
        from clients.families import load_spec

        volunteer_for_the_oom_killer()
        config = json.loads(args["model_config"])
        spec = load_spec(Path(args["model_repository"]))
        text, folder = spec.text, spec.text.folder
        parameters = config.get("parameters", {})

        def parameter(name: str, default: int) -> int:
            value = parameters.get(name, {}).get("string_value", "").strip()
            return int(value) if value else default

        providers = parameters.get(PROVIDERS_PARAMETER, {}).get("string_value", "")
        rows = parameter(RUNNING_ROWS_PARAMETER, MAX_RUNNING_ROWS)
        waiting = parameter(WAITING_PARAMETER, MAX_WAITING)
        threads = intra_op_threads(config)
        limit_torch_threads(threads)
        version = Path(args["model_repository"]) / args["model_version"]

        def graph() -> Graph:
            return Graph(open_session(version / GRAPH_FILE, threads, [p for p in providers.split(",") if p]))

        if (version / IR_FILE).is_file():  # [export] engine = "openvino": the graph for beam search only
            from app.triton.causal_lm_openvino import OpenVinoScheduler, open_pipeline, sized_cache

            cache_gb = sized_cache(folder, text.sequence_length, parameter(CACHE_GB_PARAMETER, 0))
            LOG.info("the openvino engine's key/value cache: up to %d GB (%s)", cache_gb, CACHE_GB_PARAMETER)
            precision = PRECISIONS[spec.export.get(PRECISION_KEY, "fp32")]  # checked at preparation
            tokens = parameter(BATCHED_TOKENS_PARAMETER, BATCHED_TOKENS)
            pipeline = open_pipeline(version, threads, cache_gb, tokens, rows, precision)
            self.scheduler = OpenVinoScheduler(folder, pipeline, graph, rows, max_waiting=waiting)
            self.scheduler.show = triton_gauges(args["model_name"])
        else:
            self.scheduler = Scheduler(folder, graph(), rows, max_waiting=waiting)
        self.scheduler.counts.observe = self.scheduler.beams.counts.observe = triton_metrics(args["model_name"])
        self.scheduler.waited = triton_queue_time(args["model_name"])
        self.scheduler.start()
        self.defaults = defaults(read_generation_config(folder))
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self._warm_up()

    def _warm_up(self) -> None:
        """A short greedy generation before the model says READY, and a beam search where the folder's
        default is one: the first caller does not pay for ONNX Runtime's first runs (nor, searching
        by default, for loading ``generate``: ``causal_lm_beams``)."""
        token = min(self.scheduler.ends, default=0)
        for beams in sorted({1, int(self.defaults["num_beams"])}):
            waited = Waited()
            settings = {**self.defaults, "max_new_tokens": 2, "do_sample": False, "num_beams": beams}
            ids = np.array([token], np.int64)
            self.scheduler.submit(Request(ids, settings, time.monotonic() + WARM_UP_S, waited))
            waited.wait(WARM_UP_S)

    def execute(self, requests: list) -> None:
        for request in requests:
            stream = Stream(request.get_response_sender())
            try:
                arrays = {name: present(pb_utils.get_input_tensor_by_name(request, name)) for name in self.input_names}
                ids, settings, timeout_s, grammar = read_request(
                    {name: array for name, array in arrays.items() if array is not None}, self.defaults
                )
                self.scheduler.submit(Request(ids, settings, time.monotonic() + timeout_s, stream, grammar))
            except Exception as error:  # noqa: BLE001 - answered to that request; the others go on
                stream.failed(error)
        # decoupled: nothing is returned; each request's responses go through its own sender

    def finalize(self) -> None:
        LOG.info("unloading: the scheduler stops (its running requests fail)")
        self.scheduler.close()
        self.scheduler = None
        LOG.info("unloading: the scheduler stopped")
