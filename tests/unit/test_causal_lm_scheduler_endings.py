"""What ends a text_generation request early, and what the others then get: a deadline, a caller who
cancels, a value the scheduler refuses (naming its field), the scheduler closing, a failed run of the
graph; and the batch's own bookkeeping (left padding, columns cut, turns in order). The requests that
finish still get ``model.generate``'s tokens for their prompt alone."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.core.generation_contract import DEADLINE_MARKER
from app.triton.causal_lm_requests import Cancelled, Closed, Refused
from app.triton.causal_lm_scheduler import Batch, Row, Scheduler
from app.triton.causal_lm_session import Graph, Turns
from tests.causal_scheduling import (
    WAIT_S,
    Collect,
    check_the_waiting_bound,
    generate,
    request,
    scheduler,
    turns_until_done,
)


def test_a_request_past_its_deadline_fails_and_the_others_finish(causal_lms, graphs):
    model = causal_lms("llama")[1]
    clock = [0.0]
    steps = scheduler(causal_lms, graphs, max_rows=2, clock=lambda: clock[0])
    given = [([30, 31, 32], 100.0), ([40, 41], 3.0), ([50, 51, 52, 53], 100.0), ([60], 2.0)]
    sinks = [Collect() for _ in given]
    for (prompt, deadline), sink in zip(given, sinks):
        steps.submit(request(prompt, sink, deadline=deadline, max_new_tokens=10))
    turns_until_done(steps, sinks, clock)
    late, waited = sinks[1], sinks[3]  # the last one waited for a row (max_rows 2), past its deadline
    assert len(late.tokens) == 4 and DEADLINE_MARKER in str(late.error)  # two at now 0, one at 1, one at 2
    assert waited.tokens == [] and DEADLINE_MARKER in str(waited.error)
    for i in (0, 2):
        assert sinks[i].error is None
        assert sinks[i].tokens == generate(model, given[i][0], max_new_tokens=10, do_sample=False)
    assert steps.counts["late"] == 2 and steps.counts["finished"] == 2


def test_a_request_past_the_waiting_bound_is_refused_at_once_and_the_others_are_served(causal_lms, graphs):
    clock = [0.0]
    steps = scheduler(causal_lms, graphs, max_rows=1, max_waiting=1, clock=lambda: clock[0])
    check_the_waiting_bound(steps, causal_lms("llama")[1], clock)


def test_a_cancelled_request_stops_within_a_step_and_the_others_are_unaffected(causal_lms, graphs):
    model = causal_lms("gpt2")[1]
    steps = scheduler(causal_lms, graphs, "gpt2")
    cancelled, others = Collect(cancel_after=3), [Collect(), Collect()]
    steps.submit(request([70, 71, 72], cancelled, max_new_tokens=20))
    for prompt, sink in zip(([1, 2], [99] * 5), others):
        steps.submit(request(prompt, sink, max_new_tokens=10))
    turns_until_done(steps, [cancelled, *others])
    assert len(cancelled.tokens) == 3 and isinstance(cancelled.error, Cancelled)
    for prompt, sink in zip(([1, 2], [99] * 5), others):
        assert sink.tokens == generate(model, prompt, max_new_tokens=10, do_sample=False)
    assert steps.counts["cancelled"] == 1


@pytest.mark.parametrize(
    ("ids", "settings", "field"),
    [
        ([], {}, "input_ids"),
        ([[1, 2]], {}, "input_ids"),
        ([1, "vocabulary"], {}, "input_ids"),  # the first id past the vocabulary
        ([-1], {}, "input_ids"),
        ([1], {"max_new_tokens": 0}, "max_new_tokens"),
        ([1] * 100, {"max_new_tokens": 29}, "max_new_tokens"),  # 128 positions
        ([1], {"top_k": "vocabulary + 1"}, "top_k"),
        ([1], {"top_p": 0.0}, "top_p"),
        ([1], {"temperature": float("nan")}, "temperature"),
        ([1], {"repetition_penalty": 101.0}, "repetition_penalty"),
        ([1], {"num_beams": 9}, "num_beams"),
        ([1], {"seed": -2}, "seed"),
    ],
)
def test_refused_values_name_their_field(causal_lms, graphs, ids, settings, field):
    steps = scheduler(causal_lms, graphs)
    size = {"vocabulary": steps.vocabulary, "vocabulary + 1": steps.vocabulary + 1}
    ids = [size.get(i, i) if isinstance(i, str) else i for i in ids]
    settings = {name: size.get(value, value) if isinstance(value, str) else value for name, value in settings.items()}
    with pytest.raises(Refused, match=f"^{field}"):
        steps.submit(request(ids, **settings))
    steps.submit(request([1] * 100, max_new_tokens=28))  # the context's last position is allowed


def test_closing_ends_every_request_left(causal_lms, graphs):
    steps = scheduler(causal_lms, graphs, max_rows=1)
    running, waiting = Collect(), Collect()
    steps.submit(request([1, 2], running, max_new_tokens=50))
    steps.submit(request([3, 4], waiting))
    steps.turn(block=False)
    steps.close()
    assert isinstance(running.error, Closed) and isinstance(waiting.error, Closed)
    assert len(running.tokens) == 2 and waiting.tokens == []


def test_a_batch_pads_on_the_left_and_cuts_the_columns_no_row_needs():
    batch = Batch([np.zeros((0, 1, 0, 1), np.float32)])
    rows = [Row(request([1]), None) for _ in range(3)]
    long_mask = np.array([[1, 1, 1, 1]])
    batch.join(rows[:1], long_mask, [np.arange(4, dtype=np.float32).reshape(1, 1, 4, 1)], [7])
    batch.join(rows[1:], np.array([[0, 1], [1, 1]]), [np.full((2, 1, 2, 1), 9, np.float32)], [8, 9])
    assert batch.mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]]
    assert batch.cache[0][:, 0, :, 0].tolist() == [[0, 1, 2, 3], [0, 0, 9, 9], [0, 0, 9, 9]]
    assert batch.last[:, 0].tolist() == [7, 8, 9]
    _, mask, positions = batch.feed()
    assert mask[:, -1].tolist() == [1, 1, 1] and positions[:, 0].tolist() == [4, 1, 2]
    batch.keep([1, 2])  # the long row ended: the two columns only it used go
    assert batch.mask.tolist() == [[0, 1], [1, 1]] and batch.cache[0][:, 0, :, 0].tolist() == [[9, 9], [9, 9]]
    assert batch.rows == rows[1:] and batch.last[:, 0].tolist() == [8, 9]
    batch.keep([])
    assert batch.mask.shape == (0, 0) and batch.cache[0].shape == (0, 1, 0, 1)


def test_turns_on_the_graph_are_granted_in_the_order_they_were_asked_for():
    turns, order = Turns(), []

    def take(name):
        with turns:
            order.append(name)

    threads = [threading.Thread(target=take, args=(name,)) for name in "cba"]
    with turns:
        for asked, thread in enumerate(threads, start=2):
            thread.start()
            while turns._next_ticket < asked:  # it has asked, and waits
                time.sleep(0.001)
    for thread in threads:
        thread.join(WAIT_S)
    assert order == ["c", "b", "a"]


class Failing(Graph):
    """The graph, whose run fails at its calls numbered in ``failing`` (from 0)."""

    def __init__(self, graph: Graph, failing: set[int]) -> None:
        super().__init__(graph.session)
        self.calls, self.failing = 0, failing

    def run(self, *args, **kwargs):
        self.calls += 1
        if self.calls - 1 in self.failing:
            raise RuntimeError("out of memory")
        return super().run(*args, **kwargs)


def test_a_failed_run_fails_the_rows_it_ran_and_the_loop_goes_on(causal_lms, graphs):
    folder, model = causal_lms("llama")
    steps = Scheduler(folder, Failing(graphs["llama"], {0, 3}))
    joining, running, later = Collect(), Collect(), Collect()
    steps.submit(request([1, 2], joining))  # its prompt step is call 0
    steps.turn(block=False)
    steps.submit(request([3, 4], running, max_new_tokens=10))  # calls 1 (prompt), 2, then 3 fails
    turns_until_done(steps, [joining, running])
    steps.submit(request([5, 6], later, max_new_tokens=4))
    turns_until_done(steps, [later])
    assert "out of memory" in str(joining.error) and joining.tokens == []
    assert "out of memory" in str(running.error) and len(running.tokens) == 2
    assert later.tokens == generate(model, [5, 6], max_new_tokens=4, do_sample=False)
    assert steps.counts["failed"] == 2
