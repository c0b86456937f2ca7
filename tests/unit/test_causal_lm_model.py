"""The text_generation Triton model (``app/triton/causal_lm_model.py``) with a stand-in for
``triton_python_backend_utils``: each request's responses as its sender gets them, one a token, the
last with the final flag, errors with their Triton codes. (Triton itself runs it in the integration
tests, once the family's pieces are served together.)"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest
import torch

from app.core.causal_lm_contract import (
    BUSY_MARKER,
    GRAPH_FILE,
    INPUT_IDS,
    LOGPROB,
    RUNNING_ROWS_PARAMETER,
    TOKEN_ID,
    WAITING_PARAMETER,
    inputs,
)
from app.core.generation_contract import DEADLINE_MARKER, TIMEOUT_MS
from app.triton import causal_lm_model as backend

FINAL = 1
WAIT_S = 60


class FakeUtils:
    """The pieces of triton_python_backend_utils the model uses."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL

    class TritonError(SimpleNamespace):
        INTERNAL, INVALID_ARG, UNAVAILABLE, CANCELLED = "INTERNAL", "INVALID_ARG", "UNAVAILABLE", "CANCELLED"

        def __init__(self, message, code="INTERNAL"):
            super().__init__(message=message, code=code)

    Tensor = staticmethod(lambda name, array: SimpleNamespace(name=name, array=array))

    @staticmethod
    def InferenceResponse(output_tensors=(), error=None):
        return SimpleNamespace(tensors={t.name: t.array for t in output_tensors}, error=error)

    @staticmethod
    def get_input_tensor_by_name(request, name):
        array = request.tensors.get(name)
        return None if array is None else SimpleNamespace(as_numpy=lambda: array)


class FakeMetricFamily:
    """pb_utils.MetricFamily: each metric's labels and value, by the family's name."""

    COUNTER, HISTOGRAM = "COUNTER", "HISTOGRAM"
    values: ClassVar[dict] = {}

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels, buckets=None):
        key = (self.name, tuple(sorted(labels.items())))
        FakeMetricFamily.values[key] = 0
        values = FakeMetricFamily.values

        class Metric:
            def increment(self, added):
                values[key] += added

            def observe(self, value):  # a histogram: its count of observations
                assert value >= 0
                values[key] += 1

        return Metric()


FakeUtils.MetricFamily = FakeMetricFamily


def metric(name: str, **labels) -> int:
    return FakeMetricFamily.values[(name, tuple(sorted({"model": "chat", **labels}.items())))]


class Sender:
    """A response sender: keeps (response, flags); says cancelled once it has sent ``cancel_after``."""

    def __init__(self, cancel_after=None, delay_s=0.0) -> None:
        self.sent: list = []
        self.done = threading.Event()
        self.cancel_after, self.delay_s = cancel_after, delay_s

    def send(self, response=None, flags=0):
        assert not self.done.is_set(), "a response after the final one"
        self.sent.append((response, flags))
        time.sleep(self.delay_s)
        if flags & FINAL:
            self.done.set()

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def tokens(self) -> list[int]:
        return [int(t) for response, _ in self.sent if response.error is None for t in response.tensors[TOKEN_ID]]


def triton_request(prompt, sender=None, **settings) -> SimpleNamespace:
    dtypes = {tensor["name"]: tensor["dtype"] for tensor in inputs()}
    numpy_types = {"INT32": np.int32, "INT64": np.int64, "FP64": np.float64, "BOOL": np.bool_}
    tensors = {INPUT_IDS: np.asarray(prompt, np.int64)}
    tensors |= {name: np.array([value], numpy_types[dtypes[name]]) for name, value in settings.items()}
    sender = sender or Sender()
    return SimpleNamespace(tensors=tensors, sender=sender, get_response_sender=lambda: sender)


def initialized(folder: Path, repository: Path):
    """The Triton model initialised on ``folder`` as Triton would (``pb_utils`` faked), and the patch
    to undo after ``finalize``."""
    (repository / "1").mkdir(parents=True)
    (repository / "1" / GRAPH_FILE).symlink_to(folder / GRAPH_FILE)
    patch = pytest.MonkeyPatch()
    patch.setattr(backend, "pb_utils", FakeUtils)
    patch.setattr(backend, "CANCEL_CHECK_S", 0.0)  # asked at every step: the tests count tokens exactly
    patch.setattr("clients.families.load_spec", lambda _: SimpleNamespace(text=SimpleNamespace(folder=folder)))
    config = {
        "input": inputs(),
        "parameters": {
            "ort_intra_op_threads": {"string_value": "1"},
            RUNNING_ROWS_PARAMETER: {"string_value": "4"},
            WAITING_PARAMETER: {"string_value": "8"},
        },
    }
    served = backend.TritonPythonModel()
    served.initialize(
        {
            "model_config": json.dumps(config),
            "model_repository": str(repository),
            "model_version": "1",
            "model_name": "chat",
        }
    )
    return served, patch


@pytest.fixture(scope="module")
def model(causal_lms, tmp_path_factory):
    served, patch = initialized(causal_lms("llama")[0], tmp_path_factory.mktemp("text-generation"))
    yield served
    served.finalize()
    patch.undo()


def generate(causal_lms, prompt, **settings) -> list[int]:
    model = causal_lms("llama")[1]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **settings)[
            0, len(prompt) :
        ].tolist()


def test_initialize_reads_its_parameters_and_warms_up(model):
    assert model.scheduler.max_rows == 4 and model.scheduler.max_waiting == 8 and model.scheduler.thread.is_alive()
    assert metric("text_generation_queue_duration_seconds") >= 1  # the warm-up's wait for its first step
    # greedy by default: the warm-up runs the step loop; beam search's generate is loaded at its first request
    assert model.scheduler.counts["finished"] == 1 and model.scheduler.beams.counts["finished"] == 0


def test_a_folder_that_searches_by_default_warms_up_its_beam_search_too(causal_lms, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(causal_lms("llama")[0], folder, symlinks=True)  # links to the shared small models
    path = folder / "generation_config.json"
    searching = {**json.loads(path.read_text()), "num_beams": 3}
    path.unlink()  # a file of its own, not written through the link
    path.write_text(json.dumps(searching))
    served, patch = initialized(folder, tmp_path / "repository")
    try:
        assert served.scheduler.counts["finished"] == 1 and served.scheduler.beams.counts["finished"] == 1
    finally:
        served.finalize()
        patch.undo()


def test_each_token_is_a_response_and_the_last_is_final(model, causal_lms):
    given = [([5, 6, 7], 9), ([40] * 5, 4), ([100], 12), ([9, 8], 6), ([77, 78], 3)]  # 5 requests, 4 rows
    requests = [triton_request(prompt, max_new_tokens=new, timeout_ms=60000) for prompt, new in given]
    assert model.execute(requests) is None
    assert all(request.sender.done.wait(WAIT_S) for request in requests)
    for (prompt, new), request in zip(given, requests):
        assert request.sender.tokens() == generate(causal_lms, prompt, max_new_tokens=new)
        assert [flags for _, flags in request.sender.sent] == [0] * (len(request.sender.sent) - 1) + [FINAL]
        response = request.sender.sent[0][0]
        assert response.tensors[TOKEN_ID].shape == (1,) and response.tensors[TOKEN_ID].dtype == np.int64
        assert response.tensors[LOGPROB].shape == (1,) and response.tensors[LOGPROB].dtype == np.float32
        assert response.tensors[LOGPROB][0] <= 0


def test_a_setting_not_sent_is_the_folders_default(model, causal_lms):
    request = triton_request([3, 4, 5])  # no settings, no timeout: 20 new tokens, greedy
    model.execute([request])
    assert request.sender.done.wait(WAIT_S)
    assert request.sender.tokens() == generate(causal_lms, [3, 4, 5], max_new_tokens=20)


def test_beam_search_answers_every_token_in_one_final_response(model, causal_lms):
    request = triton_request([12, 13, 14], num_beams=3, max_new_tokens=8)
    model.execute([request])
    assert request.sender.done.wait(WAIT_S)
    ((response, flags),) = request.sender.sent
    assert flags == FINAL and response.tensors[TOKEN_ID].shape == response.tensors[LOGPROB].shape
    assert request.sender.tokens() == generate(causal_lms, [12, 13, 14], num_beams=3, max_new_tokens=8)


@pytest.mark.parametrize(
    ("prompt", "settings", "field"),
    [
        ([1, 99_999], {}, INPUT_IDS),
        ([1], {"top_k": 100_000}, "top_k"),
        ([1], {"max_new_tokens": 200}, "max_new_tokens"),
        ([1], {TIMEOUT_MS: 0}, TIMEOUT_MS),
    ],
)
def test_refused_values_are_one_final_invalid_arg_naming_the_field(model, prompt, settings, field):
    refused, fine = triton_request(prompt, **settings), triton_request([1, 2], max_new_tokens=2)
    model.execute([refused, fine])
    assert refused.sender.done.wait(WAIT_S) and fine.sender.done.wait(WAIT_S)
    ((response, flags),) = refused.sender.sent
    assert flags == FINAL and response.error.code == "INVALID_ARG" and response.error.message.startswith(field)
    assert len(fine.sender.tokens()) == 2


def test_a_request_past_its_deadline_ends_unavailable(model):
    # The first token comes well within the second (a busy machine's thread switch took over 5 ms);
    # sending each token takes a second, so the deadline passes while the first is sent.
    slow = Sender(delay_s=1.0)
    request = triton_request([1, 2, 3], slow, max_new_tokens=50, timeout_ms=1000)
    model.execute([request])
    assert slow.done.wait(WAIT_S)
    response, flags = slow.sent[-1]
    assert flags == FINAL and response.error.code == "UNAVAILABLE" and DEADLINE_MARKER in response.error.message
    assert 1 <= len(slow.tokens()) < 50


def test_a_request_past_the_waiting_bound_ends_unavailable_naming_the_queue(model, monkeypatch):
    monkeypatch.setattr(model.scheduler, "max_waiting", 0)  # none may wait: the next one is refused
    before = metric("text_generation_requests_total", outcome="busy")
    sender = Sender()
    model.execute([triton_request([1, 2, 3], sender, max_new_tokens=5)])
    ((response, flags),) = sender.sent
    assert flags == FINAL and response.error.code == "UNAVAILABLE" and BUSY_MARKER in response.error.message
    assert metric("text_generation_requests_total", outcome="busy") == before + 1


def test_a_cancelled_request_ends_at_the_next_step(model, causal_lms):
    cancelled, other = Sender(cancel_after=3), Sender()
    before = metric("text_generation_requests_total", outcome="cancelled")
    model.execute([triton_request([7, 8], cancelled, max_new_tokens=30), triton_request([9], other, max_new_tokens=10)])
    assert cancelled.done.wait(WAIT_S) and other.done.wait(WAIT_S)
    assert len(cancelled.tokens()) == 3 and cancelled.sent[-1][0].error.code == "CANCELLED"
    assert metric("text_generation_requests_total", outcome="cancelled") == before + 1  # Triton's metrics
    assert metric("text_generation_steps_total") > 0
    assert other.tokens() == generate(causal_lms, [9], max_new_tokens=10)


def test_triton_is_asked_about_cancellation_at_most_every_fifty_milliseconds(monkeypatch):
    monkeypatch.setattr(backend, "CANCEL_CHECK_S", 0.05)
    now = [0.0]
    sender = Sender(cancel_after=0)
    asked = []
    sender.is_cancelled = lambda: asked.append(now[0]) or True
    stream = backend.Stream(sender, clock=lambda: now[0])
    answers = []
    for step in range(11):  # a step every 10 ms
        now[0] = step * 0.01
        answers.append(stream.cancelled())
    assert asked == [0.0, 0.05, 0.1] and answers.count(True) == 3
