"""The python backend's model.py: many requests, one ONNX Runtime run, outputs split back in order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from app.triton import onnx_model as backend


def _feeds(sizes):
    return [
        {"x": np.full((n, 3), i, dtype=np.float32), "mask": np.ones((n, 2), dtype=np.int64)}
        for i, n in enumerate(sizes)
    ]


def test_requests_share_one_run_and_get_their_own_rows_back():
    calls = []

    def run(feed):
        calls.append({name: array.shape for name, array in feed.items()})
        return [feed["x"] * 2, feed["x"].sum(axis=1)]

    results = backend.run_batched(run, _feeds([1, 3, 2]), ["double", "total"])

    assert calls == [{"x": (6, 3), "mask": (6, 2)}]
    assert [r["double"].shape[0] for r in results] == [1, 3, 2]
    for i, result in enumerate(results):
        assert set(result) == {"double", "total"}
        np.testing.assert_array_equal(result["double"], np.full((len(result["double"]), 3), 2 * i))
        np.testing.assert_array_equal(result["total"], np.full(len(result["total"]), 3 * i))


def test_requests_of_different_lengths_are_padded_to_the_longest_with_zeros():
    """A text model's ragged batch: each request's [rows, tokens] padded at the end to the longest."""
    feeds = [{"ids": np.full((n, length), 7, dtype=np.int64)} for n, length in ((1, 3), (2, 5), (1, 5))]
    seen = {}

    def run(feed):
        seen.update(feed)
        return [feed["ids"].sum(axis=1), feed["ids"]]

    results = backend.run_batched(run, feeds, ["total", "ids"])
    assert seen["ids"].shape == (4, 5)
    np.testing.assert_array_equal(seen["ids"][0], [7, 7, 7, 0, 0])
    assert [r["total"].tolist() for r in results] == [[21], [35, 35], [35]]
    assert [r["ids"].shape for r in results] == [(1, 5), (2, 5), (1, 5)]
    mixed = [np.full((1, 2, 3), 1.5, dtype=np.float32), np.full((2, 3, 1), 2.5, dtype=np.float32)]
    batch = backend.joined(mixed)  # every axis after the batch's padded to the largest
    assert batch.shape == (3, 3, 3) and batch.dtype == np.float32
    assert batch[0, :2, :3].tolist() == [[1.5] * 3] * 2 and batch[0, 2].tolist() == [0, 0, 0]
    assert batch[1:, :3, :1].min() == 2.5 and batch[1:, :, 1:].max() == 0


def test_a_single_request_passes_through():
    results = backend.run_batched(lambda feed: [feed["x"] + 1], _feeds([4]), ["y"])
    assert len(results) == 1 and results[0]["y"].shape == (4, 3)


def test_an_output_with_the_wrong_batch_is_an_error():
    with pytest.raises(ValueError, match="batch"):
        backend.run_batched(lambda feed: [feed["x"][:1]], _feeds([2, 2]), ["y"])


@pytest.mark.parametrize(
    ("config", "threads"),
    [
        ({}, 0),
        ({"parameters": {"ort_intra_op_threads": {"string_value": "3"}}}, 3),
        ({"parameters": {"ort_intra_op_threads": {"string_value": ""}}}, 0),
    ],
)
def test_intra_op_threads_come_from_the_config(config, threads):
    assert backend.intra_op_threads(config) == threads


class _FakeUtils:
    """The few pieces of triton_python_backend_utils that execute() uses."""

    class TritonError(SimpleNamespace):
        INTERNAL, INVALID_ARG = "INTERNAL", "INVALID_ARG"

        def __init__(self, message, code="INTERNAL"):
            super().__init__(message=message, code=code)

    Tensor = staticmethod(lambda name, array: SimpleNamespace(name=name, array=array))

    @staticmethod
    def InferenceResponse(output_tensors=(), error=None):
        return SimpleNamespace(output_tensors=list(output_tensors), error=error)

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return SimpleNamespace(as_numpy=lambda: request[name])


def _model(monkeypatch, run):
    monkeypatch.setattr(backend, "pb_utils", _FakeUtils)
    model = backend.TritonPythonModel()
    model.input_names = ["x", "mask"]
    model.outputs = [("y", np.float32)]
    monkeypatch.setattr(model, "_run", run)
    return model


def test_execute_answers_each_request_in_order(monkeypatch):
    model = _model(monkeypatch, lambda feed: [feed["x"].astype(np.float64)])
    responses = model.execute(_feeds([2, 1]))
    assert [r.error for r in responses] == [None, None]
    assert [r.output_tensors[0].array.tolist() for r in responses] == [[[0.0] * 3] * 2, [[1.0] * 3]]
    assert responses[0].output_tensors[0].array.dtype == np.float32


def test_a_failed_run_gives_every_request_an_error_response(monkeypatch):
    def broken(feed):
        raise RuntimeError("out of memory")

    responses = _model(monkeypatch, broken).execute(_feeds([1, 2, 1]))
    assert len(responses) == 3
    assert all("RuntimeError: out of memory" in r.error.message for r in responses)


class InvalidArgument(Exception):
    """ONNX Runtime's exception for input values a node refuses (its class name is what counts)."""


def test_a_request_whose_values_fail_fails_alone_and_is_the_callers_fault(monkeypatch):
    def run(feed):  # a token id past the vocabulary: ONNX Runtime's Gather refuses it
        if (feed["x"] >= 2).any():
            raise InvalidArgument("indices element out of data bounds, idx=2")
        return [feed["x"].astype(np.float64)]

    responses = _model(monkeypatch, run).execute(_feeds([1, 1, 1]))
    assert [r.error is None for r in responses] == [True, True, False]
    assert [r.output_tensors[0].array.tolist() for r in responses[:2]] == [[[0.0] * 3], [[1.0] * 3]]
    assert responses[2].error.code == "INVALID_ARG" and "out of data bounds" in responses[2].error.message


def test_the_stub_volunteers_for_the_oom_killer(tmp_path):
    """Before ONNX Runtime takes the model's memory, the stub raises its own OOM score to the top, so
    that a model that does not fit costs its own load, not Triton (tests/container/test_image.py runs
    such a load in a 768 MiB container: 507, Triton lives)."""
    score = tmp_path / "oom_score_adj"
    score.write_text("0")
    backend.volunteer_for_the_oom_killer(score)
    assert score.read_text() == "1000"
    backend.volunteer_for_the_oom_killer(tmp_path / "missing" / "oom_score_adj")  # no /proc: nothing raised
