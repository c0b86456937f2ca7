"""The text_generation scheduler against Hugging Face's ``generate``, on tiny random-weight models
(``causal_lms``): whoever a request is batched with, and whenever it joins, its tokens are those
``model.generate`` gives its prompt alone, token for token, and its log-probabilities those of
``generate``'s processed scores. What ends a request early (deadlines, cancelling, refusals, closing,
a failed run): ``test_causal_lm_scheduler_endings.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from app.core.generation_contract import DEADLINE_MARKER
from app.core.settings import PROJECT_ROOT
from app.triton.causal_lm_scheduler import Scheduler
from app.triton.causal_lm_session import Graph
from tests.causal_scheduling import (
    KINDS,
    WAIT_S,
    Collect,
    drawn,
    ending_at_a_new_token,
    generate,
    prompts,
    request,
    scheduler,
    turns_until_done,
)


@pytest.mark.parametrize("kind", KINDS)
def test_callers_joining_at_different_steps_get_their_own_generate(causal_lms, graphs, kind):
    model = causal_lms(kind)[1]
    steps = scheduler(causal_lms, graphs, kind)
    joins = {0: ([5, 17, 99, 3, 42, 7, 250], 20), 2: ([9], 1), 4: ([11, 12, 13], 12), 7: (list(range(30, 41)), 8)}
    sinks = {}
    for turn in range(40):
        if turn in joins:
            prompt, new = joins[turn]
            sinks[turn] = Collect()
            steps.submit(request(prompt, sinks[turn], max_new_tokens=new))
        steps.turn(block=False)
        # the cache is as long as the longest running row needs (what a long prompt left is cut)
        run = [len(row.request.ids) + row.made - 1 for row in steps.batch.rows]
        assert steps.batch.mask.shape[1] == max(run, default=0)
        assert {a.shape[2] for a in steps.batch.cache} == {max(run, default=0)}
    for turn, (prompt, new) in joins.items():
        assert sinks[turn].done.is_set() and sinks[turn].error is None
        assert sinks[turn].tokens == generate(model, prompt, max_new_tokens=new, do_sample=False), turn
        assert sinks[turn].lasts == [False] * (len(sinks[turn].tokens) - 1) + [True]
    assert steps.counts["finished"] == 4


def test_eight_requests_at_once_each_get_their_own_generate(causal_lms, graphs):
    model = causal_lms("qwen2")[1]
    steps = scheduler(causal_lms, graphs, "qwen2", max_rows=6).start()  # two wait for a row to end
    try:
        given = [(prompt, 3 + 2 * i, 1.0 + 0.1 * (i % 3)) for i, prompt in enumerate(prompts(8))]
        sinks = [Collect() for _ in given]
        for (prompt, new, penalty), sink in zip(given, sinks):
            steps.submit(request(prompt, sink, max_new_tokens=new, repetition_penalty=penalty))
        assert all(sink.done.wait(WAIT_S) for sink in sinks)
    finally:
        steps.close()
    for (prompt, new, penalty), sink in zip(given, sinks):
        assert sink.tokens == generate(model, prompt, max_new_tokens=new, repetition_penalty=penalty, do_sample=False)


def test_greedy_with_a_repetition_penalty_and_its_logprobs_are_generates(causal_lms, graphs):
    model = causal_lms("gpt2")[1]
    steps = scheduler(causal_lms, graphs, "gpt2")
    given = [([7, 7, 8, 9, 7], 1.5), ([100, 101], 0.7), ([3] * 9, 1.0)]
    sinks = [Collect() for _ in given]
    for (prompt, penalty), sink in zip(given, sinks):
        steps.submit(request(prompt, sink, max_new_tokens=15, repetition_penalty=penalty))
    turns_until_done(steps, sinks)
    for (prompt, penalty), sink in zip(given, sinks):
        tokens, scores = generate(model, prompt, True, max_new_tokens=15, repetition_penalty=penalty, do_sample=False)
        assert sink.tokens == tokens
        wanted = torch.log_softmax(scores, -1)[torch.arange(len(tokens)), tokens]
        np.testing.assert_allclose(sink.logprobs, wanted.numpy(), atol=1e-4)


def test_greedy_rows_alone_choose_generate_s_tokens_and_log_probabilities(causal_lms, graphs):
    # no penalty, no draw: the step is chosen in numpy (causal_lm_tokens.greedy), not by torch
    model = causal_lms("mistral")[1]
    steps = scheduler(causal_lms, graphs, "mistral")
    given = [[7, 7, 8, 9, 7], [100, 101], [3] * 9]
    sinks = [Collect() for _ in given]
    for prompt, sink in zip(given, sinks):
        steps.submit(request(prompt, sink, max_new_tokens=15))
    turns_until_done(steps, sinks)
    for prompt, sink in zip(given, sinks):
        tokens, scores = generate(model, prompt, True, max_new_tokens=15, do_sample=False)
        assert sink.tokens == tokens
        wanted = torch.log_softmax(scores, -1)[torch.arange(len(tokens)), tokens]
        np.testing.assert_allclose(sink.logprobs, wanted.numpy(), atol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen3"])
def test_the_prompts_log_probabilities_are_log_softmax_of_the_models_logits(causal_lms, graphs, kind):
    model = causal_lms(kind)[1]
    steps = scheduler(causal_lms, graphs, kind)
    scored = [([5, 17, 99, 3, 42, 7, 250], 3), ([9], 0), ([11, 12, 13, 14], 5)]  # one token: nothing to score
    sinks = [Collect() for _ in range(len(scored) + 1)]
    for (prompt, top), sink in zip(scored, sinks):
        steps.submit(request(prompt, sink, max_new_tokens=6, prompt_logprobs=top))
    steps.submit(request([30, 31, 32], sinks[-1], max_new_tokens=6))  # joins at the same step, asks none
    turns_until_done(steps, sinks)
    assert sinks[-1].prompt_logprobs is None
    assert sinks[-1].tokens == generate(model, [30, 31, 32], max_new_tokens=6, do_sample=False)
    for (prompt, top), sink in zip(scored, sinks):
        assert sink.tokens == generate(model, prompt, max_new_tokens=6, do_sample=False)  # run alone, the same answer
        with torch.no_grad():
            reference = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].double(), -1)
        logprobs, (ids, values) = sink.prompt_logprobs
        np.testing.assert_allclose(logprobs, reference[torch.arange(len(prompt) - 1), prompt[1:]].numpy(), atol=1e-4)
        best = reference.topk(top, -1)
        assert ids.shape == (len(prompt) - 1, top) and ids.tolist() == best.indices.tolist()
        np.testing.assert_allclose(values, best.values.numpy(), atol=1e-4)


class Recorded(Graph):
    """The graph, each run's batch and new-token count kept."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph.session)
        self.shapes: list[tuple[int, int]] = []

    def run(self, ids, *args, **kwargs):
        self.shapes.append(ids.shape)
        return super().run(ids, *args, **kwargs)


def test_the_rows_of_one_prompt_run_it_once_and_draw_as_alone(causal_lms, graphs):
    """OpenAI's ``n`` choices (a prompt's rows, each its seed) joining at one step: the prompt's step
    runs it once, and each row draws what it draws alone."""
    folder, _ = causal_lms("llama")
    prompt, other = [12, 40, 41, 200, 7], [5, 6]
    recorded = Recorded(graphs["llama"])
    steps = Scheduler(folder, recorded)
    sinks = [Collect() for _ in range(4)]
    for seed, sink in zip((5, 6, 7), sinks):
        steps.submit(request(prompt, sink, seed=seed, **SAMPLING))
    steps.submit(request(other, sinks[3], max_new_tokens=4))
    turns_until_done(steps, sinks)
    assert recorded.shapes[0] == (2, len(prompt)) and steps.counts["shared"] == 2  # two prompts, four rows
    make = lambda: scheduler(causal_lms, graphs, "llama")
    for seed, sink in zip((5, 6, 7), sinks):
        assert sink.tokens == drawn(make, prompt, seed, SAMPLING).tokens
    assert len({tuple(sink.tokens) for sink in sinks[:3]}) > 1  # three draws, not one thrice
    assert sinks[3].tokens == generate(causal_lms("llama")[1], other, max_new_tokens=4, do_sample=False)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_prompt_a_running_row_began_with_runs_only_its_last_token(causal_lms, graphs, kind):
    """Rows of one prompt arriving a step apart (the router starts OpenAI's ``n`` choices one after
    another): the later ones take the running row's keys and values of the prompt and run its last
    token alone; each answer is what it is alone."""
    folder, model = causal_lms(kind)
    prompt = [12, 40, 41, 200, 7, 9]
    recorded = Recorded(graphs[kind])
    steps = Scheduler(folder, recorded)
    first, second, longer = Collect(), Collect(), Collect()
    steps.submit(request(prompt, first, max_new_tokens=8))
    steps.turn(block=False)
    steps.turn(block=False)  # the first row has run its prompt and two steps
    made = list(first.tokens)
    steps.submit(request(prompt, second, seed=6, **SAMPLING))
    steps.submit(request(prompt + made[:2], longer, max_new_tokens=5))  # its tokens so far begin this one
    turns_until_done(steps, [first, second, longer])
    assert steps.counts["shared"] == 2 and recorded.shapes[3:5] == [(1, 1), (1, 1)]
    assert first.tokens == generate(model, prompt, max_new_tokens=8, do_sample=False)
    assert second.tokens == drawn(lambda: scheduler(causal_lms, graphs, kind), prompt, 6, SAMPLING).tokens
    assert longer.tokens == generate(model, prompt + made[:2], max_new_tokens=5, do_sample=False)


SAMPLING = {"do_sample": True, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "max_new_tokens": 16}


def test_a_seeded_request_draws_the_same_alone_batched_and_as_generate(causal_lms, graphs):
    model = causal_lms("phi3")[1]
    prompt, make = [12, 40, 41, 200], lambda: scheduler(causal_lms, graphs, "phi3")
    alone = drawn(make, prompt, 7, SAMPLING)
    others = [([5, 6], SAMPLING | {"seed": 8}), ([9] * 12, {}), ([1, 2, 3], SAMPLING)]
    batched = drawn(make, prompt, 7, SAMPLING, others)
    assert batched.tokens == alone.tokens
    assert drawn(make, prompt, 8, SAMPLING).tokens != alone.tokens
    torch.manual_seed(7)
    tokens, scores = generate(model, prompt, True, **SAMPLING)
    assert alone.tokens == tokens
    wanted = torch.log_softmax(scores, -1)[torch.arange(len(tokens)), tokens]
    np.testing.assert_allclose(alone.logprobs, wanted.numpy(), atol=1e-4)


def test_an_end_of_sequence_token_ends_its_row_and_is_sent(causal_lms, graphs, tmp_path):
    prompt = [20, 21, 22]
    model, end, _ = ending_at_a_new_token(causal_lms, tmp_path, prompt)
    steps = Scheduler(tmp_path, graphs["llama"])
    ended, other = Collect(), Collect()
    other_prompt = next(p for p in prompts(20, 1) if end not in generate(model, p, max_new_tokens=12, do_sample=False))
    steps.submit(request(prompt, ended, max_new_tokens=12))
    steps.submit(request(other_prompt, other, max_new_tokens=12))
    turns_until_done(steps, [ended, other])
    assert ended.tokens == generate(model, prompt, max_new_tokens=12, do_sample=False, eos_token_id=[end, 2])
    assert ended.tokens[-1] == end and len(ended.tokens) < 12 and ended.lasts[-1]
    assert other.tokens == generate(model, other_prompt, max_new_tokens=12, do_sample=False)


def test_beam_search_is_generates_and_streams_go_on_beside_it(causal_lms, graphs):
    model = causal_lms("qwen2")[1]
    steps = scheduler(causal_lms, graphs, "qwen2").start()
    try:
        beams = [([4, 5, 6, 7], {"num_beams": 3}), ([80, 81], {"num_beams": 4, "repetition_penalty": 1.3})]
        streams = [([9, 10], 14), ([50] * 6, 9)]
        beam_sinks, stream_sinks, late = [Collect() for _ in beams], [Collect() for _ in streams], Collect()
        for (prompt, settings), sink in zip(beams, beam_sinks):
            steps.submit(request(prompt, sink, max_new_tokens=12, **settings))
        steps.submit(request([4, 5], late, deadline=time.monotonic(), num_beams=2))
        for (prompt, new), sink in zip(streams, stream_sinks):
            steps.submit(request(prompt, sink, max_new_tokens=new))
        assert all(sink.done.wait(WAIT_S) for sink in [*beam_sinks, *stream_sinks, late])
    finally:
        steps.close()
    for (prompt, settings), sink in zip(beams, beam_sinks):
        assert sink.error is None
        assert sink.tokens == generate(model, prompt, max_new_tokens=12, do_sample=False, **settings)
        assert len(sink.logprobs) == len(sink.tokens) and max(sink.logprobs) <= 0
    for (prompt, new), sink in zip(streams, stream_sinks):
        assert sink.tokens == generate(model, prompt, max_new_tokens=new, do_sample=False)
    assert DEADLINE_MARKER in str(late.error) and steps.beams.counts["late"] == 1


# A process that serves one model (it imports what the Triton model imports and sets PyTorch's threads
# as its initialize does): it streams greedily, then searches with beams.
ONLY_BEAMS_IMPORT_GENERATE = """
import json, sys, threading
import numpy as np
from pathlib import Path
import app.triton.causal_lm_model
from app.triton.onnx_model import limit_torch_threads
limit_torch_threads(1)
from app.core.settings import PROJECT_ROOT
from app.core.causal_lm_contract import GRAPH_FILE, SETTINGS
from app.triton.causal_lm_requests import Request
from app.triton.causal_lm_scheduler import Scheduler
from app.triton.causal_lm_session import Graph
from app.triton.causal_lm_session import Graph, open_session

class Sink:
    def __init__(self):
        self.tokens, self.done = [], threading.Event()
    def token(self, token_id, logprob, last, alternatives=None):
        self.tokens.append(token_id)
        if last:
            self.done.set()
    def sequence(self, token_ids, logprobs):
        self.tokens = list(token_ids)
        self.done.set()
    def failed(self, error):
        raise error
    def cancelled(self):
        return False

def answer(**settings):
    sink = Sink()
    given = {s.name: s.default for s in SETTINGS} | {"max_new_tokens": 8} | settings
    steps.submit(Request(np.asarray([4, 5, 6], np.int64), given, float("inf"), sink))
    assert sink.done.wait(60)
    return sink.tokens

folder = Path(sys.argv[1])
steps = Scheduler(folder, Graph(open_session(folder / GRAPH_FILE, 1))).start()
found = {"greedy": answer(), "after_greedy": sorted(m for m in MODULES if m in sys.modules)}
found["torch_after_greedy"] = "torch" in sys.modules
found["sampled"] = answer(do_sample=True, seed=3, top_k=20)
found |= {"torch_after_sampling": "torch" in sys.modules, "threads": sys.modules["torch"].get_num_threads()}
found |= {"after_sampling": sorted(m for m in MODULES if m in sys.modules)}
found |= {"beams": answer(num_beams=3), "after_beams": sorted(m for m in MODULES if m in sys.modules)}
steps.close()
print(json.dumps(found))
"""
GENERATE_MODULES = ["transformers.generation.utils", "transformers.modeling_utils"]


def test_generate_is_imported_at_the_first_beam_search_not_before(causal_lms):
    """A model that only streams (greedy search, sampling) never imports transformers' modelling and
    generation modules (about 3 s of CPU and 200 MB a model's process); its first beam search does, and
    answers ``generate``'s tokens. Greedy tokens alone do not import torch either: the first draw does,
    on the threads the model was given, and draws ``generate``'s tokens."""
    folder, model = causal_lms("llama")
    script = ONLY_BEAMS_IMPORT_GENERATE.replace("MODULES", repr(GENERATE_MODULES))
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after_greedy"] == [] and found["after_beams"] == GENERATE_MODULES
    assert found["greedy"] == generate(model, [4, 5, 6], max_new_tokens=8, do_sample=False)
    assert not found["torch_after_greedy"] and found["torch_after_sampling"] and found["threads"] == 1
    assert found["after_sampling"] == []
    torch.manual_seed(3)
    assert found["sampled"] == generate(model, [4, 5, 6], max_new_tokens=8, do_sample=True, top_k=20)
    assert found["beams"] == generate(model, [4, 5, 6], max_new_tokens=8, do_sample=False, num_beams=3)
