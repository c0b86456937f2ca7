"""The text_generation family on OpenVINO GenAI (``[export] engine = "openvino"``), against Hugging
Face's ``generate`` on the small-model set ``causal_openvino``: whoever a request is batched with
and whenever it joins, its greedy tokens are those ``generate`` gives its prompt alone, and their
log-probabilities its logits' log-softmax; a seeded draw is the same alone and batched; deadlines,
cancelling, closing and refusals end requests as the ONNX Runtime loop ends them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from app.core.causal_lm_contract import GRAPH_FILE, IR_FILE, cache_bytes_per_token
from app.core.generation_contract import DEADLINE_MARKER
from app.triton.causal_lm_openvino import OpenVinoScheduler, open_pipeline, sized_cache
from app.triton.causal_lm_requests import Cancelled, Closed, Refused
from app.triton.causal_lm_session import Graph, open_session
from scripts.model_prep.small_models.sets import OPENVINO_ARCHITECTURES, Built
from tests.causal_scheduling import (
    WAIT_S,
    Collect,
    check_the_waiting_bound,
    drawn,
    generate,
    prompts,
    request,
    turns_until_done,
)

KINDS = tuple(OPENVINO_ARCHITECTURES)
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "max_new_tokens": 16}


class Models:
    """Each architecture's (Hugging Face folder, version folder, PyTorch model), loaded once."""

    def __init__(self, small_models: Built) -> None:
        self.small_models = small_models
        self.loaded: dict = {}

    def __call__(self, kind: str):
        if kind not in self.loaded:
            from transformers import AutoModelForCausalLM

            name = f"{kind}_openvino"
            folder = self.small_models.models("causal_openvino") / name / "hf"
            version = self.small_models.repository("causal_openvino") / name / "1"
            self.loaded[kind] = (folder, version, AutoModelForCausalLM.from_pretrained(folder).eval())
        return self.loaded[kind]


@pytest.fixture(scope="module")
def models(small_models: Built) -> Models:
    return Models(small_models)


def scheduler(models: Models, kind: str, folder: Path | None = None, clock=None, **options) -> OpenVinoScheduler:
    hf, version, _ = models(kind)
    graph = Graph(open_session(version / GRAPH_FILE, 1))
    pipeline = open_pipeline(version, 1, 1, options.pop("tokens", 256), options.get("max_rows", 16))
    extra = {"clock": clock} if clock is not None else {}
    return OpenVinoScheduler(folder or hf, pipeline, graph, **options, **extra)


def logprobs_of(model, prompt, tokens) -> np.ndarray:
    _, scores = generate(model, prompt, True, max_new_tokens=len(tokens), do_sample=False)
    return torch.log_softmax(scores, -1)[torch.arange(len(tokens)), tokens].numpy()


def test_every_architecture_of_the_set_is_prepared_with_its_ir(models):
    for kind in KINDS:
        _, version, _ = models(kind)
        assert (version / IR_FILE).is_file() and (version / GRAPH_FILE).is_file(), kind


@pytest.mark.parametrize("kind", KINDS)
def test_callers_joining_at_different_steps_get_their_own_generate(models, kind):
    model = models(kind)[2]
    steps = scheduler(models, kind)
    joins = {0: ([5, 17, 99, 3, 42, 7, 250], 20), 2: ([9], 1), 4: ([11, 12, 13], 12), 7: (list(range(30, 41)), 8)}
    sinks = {}
    for turn in range(60):
        if turn in joins:
            prompt, new = joins[turn]
            sinks[turn] = Collect()
            steps.submit(request(prompt, sinks[turn], max_new_tokens=new))
        steps.turn(block=False)
    for turn, (prompt, new) in joins.items():
        assert sinks[turn].done.is_set() and sinks[turn].error is None, turn
        assert sinks[turn].tokens == generate(model, prompt, max_new_tokens=new, do_sample=False), turn
        assert sinks[turn].lasts == [False] * (len(sinks[turn].tokens) - 1) + [True]
        np.testing.assert_allclose(sinks[turn].logprobs, logprobs_of(model, prompt, sinks[turn].tokens), atol=1e-4)
    assert steps.counts["finished"] == 4


def test_eight_requests_at_once_on_the_thread_each_get_their_own_generate(models):
    model = models("qwen2")[2]
    steps = scheduler(models, "qwen2", max_rows=6).start()  # two wait for a row to end
    try:
        given = [(prompt, 3 + 2 * i) for i, prompt in enumerate(prompts(8))]
        sinks = [Collect() for _ in given]
        for (prompt, new), sink in zip(given, sinks):
            steps.submit(request(prompt, sink, max_new_tokens=new))
        assert all(sink.done.wait(60) for sink in sinks)
    finally:
        steps.close()
    for (prompt, new), sink in zip(given, sinks):
        assert sink.tokens == generate(model, prompt, max_new_tokens=new, do_sample=False)


def test_a_prompt_longer_than_a_step_s_token_budget_is_run_in_parts_and_answers_the_same(models):
    model = models("llama")[2]
    steps = scheduler(models, "llama", tokens=16)  # a 40-token prompt takes three steps to read
    long, short = list(range(20, 60)), [7, 8, 9]
    sinks = [Collect(), Collect()]
    steps.submit(request(long, sinks[0], max_new_tokens=6))
    steps.submit(request(short, sinks[1], max_new_tokens=6))
    turns_until_done(steps, sinks)
    assert sinks[0].tokens == generate(model, long, max_new_tokens=6, do_sample=False)
    assert sinks[1].tokens == generate(model, short, max_new_tokens=6, do_sample=False)


def test_a_repeated_prompt_start_answers_the_same_from_the_prefix_cache(models):
    # the second request's first 24 tokens are the first's: their blocks come from the prefix cache
    model = models("phi3")[2]
    steps = scheduler(models, "phi3")
    first, follow_up = list(range(40, 64)), [*range(40, 64), 5, 6, 7]
    for prompt in (first, follow_up, first):
        sink = Collect()
        steps.submit(request(prompt, sink, max_new_tokens=8))
        turns_until_done(steps, [sink])
        assert sink.tokens == generate(model, prompt, max_new_tokens=8, do_sample=False)


def test_a_seeded_draw_is_the_same_alone_and_batched_and_another_seed_draws_otherwise(models):
    prompt, make = [12, 40, 41, 200], lambda: scheduler(models, "phi3")
    alone = drawn(make, prompt, 7, SAMPLING)
    others = [([5, 6], SAMPLING | {"seed": 8}), ([9] * 12, {}), ([1, 2, 3], SAMPLING)]
    batched = drawn(make, prompt, 7, SAMPLING, others)
    assert batched.tokens == alone.tokens and len(alone.tokens) == SAMPLING["max_new_tokens"]
    assert drawn(make, prompt, 8, SAMPLING).tokens != alone.tokens
    assert all(value <= 0 for value in alone.logprobs)


def test_an_end_of_sequence_token_ends_its_row_and_is_sent(models, tmp_path):
    folder, _, model = models("llama")
    prompt = [20, 21, 22]
    free = generate(model, prompt, max_new_tokens=12, do_sample=False, eos_token_id=None)
    end = next(token for i, token in enumerate(free) if i >= 2 and token not in free[:i])
    for name in ("config.json", "generation_config.json"):
        shutil.copy(folder / name, tmp_path / name)
    import json

    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps(config | {"eos_token_id": [end, 2]}))
    steps = scheduler(models, "llama", folder=tmp_path)
    ended = Collect()
    steps.submit(request(prompt, ended, max_new_tokens=12))
    turns_until_done(steps, [ended])
    assert ended.tokens == generate(model, prompt, max_new_tokens=12, do_sample=False, eos_token_id=[end, 2])
    assert ended.tokens[-1] == end and len(ended.tokens) < 12 and ended.lasts[-1]


def test_a_request_past_the_waiting_bound_is_refused_at_once_and_the_others_are_served(models):
    """Those in the pipeline without a first token wait too (GenAI runs one row: max_rows 1)."""
    clock = [0.0]
    steps = scheduler(models, "llama", clock=lambda: clock[0], max_rows=1, max_waiting=1)
    check_the_waiting_bound(steps, models("llama")[2], clock)


def test_deadlines_cancelling_refusals_and_closing_end_requests_and_the_others_go_on(models):
    model = models("gpt2")[2]
    clock = [0.0]
    steps = scheduler(models, "gpt2", clock=lambda: clock[0])
    late, cancelled, kept = Collect(), Collect(cancel_after=2), Collect()
    steps.submit(request([5, 6, 7], late, deadline=3.5, max_new_tokens=20))
    steps.submit(request([8, 9], cancelled, max_new_tokens=20))
    steps.submit(request([10, 11, 12], kept, max_new_tokens=10))
    with pytest.raises(Refused, match="max_new_tokens"):
        steps.submit(request([1] * 10, Collect(), max_new_tokens=10_000))
    turns_until_done(steps, [late, cancelled, kept], clock)
    assert DEADLINE_MARKER in str(late.error) and 0 < len(late.tokens) < 20
    assert isinstance(cancelled.error, Cancelled) and len(cancelled.tokens) == 2
    assert kept.error is None and kept.tokens == generate(model, [10, 11, 12], max_new_tokens=10, do_sample=False)
    assert steps.counts["late"] == 1 and steps.counts["cancelled"] == 1 and steps.counts["finished"] == 1
    waiting = Collect()
    steps.submit(request([3, 4], waiting, max_new_tokens=5))
    steps.close()
    assert isinstance(waiting.error, Closed)
    with pytest.raises(Closed):
        steps.submit(request([3, 4], Collect()))


@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_s_bytes_a_token_are_those_of_the_graph_s_cache_tensors(models, kind):
    hf, version, _ = models(kind)
    graph = Graph(open_session(version / GRAPH_FILE, 1))
    config = json.loads((hf / "config.json").read_text())
    assert cache_bytes_per_token(config) == len(graph.past_names) * graph.kv_heads * graph.head_dim * 4  # float32
    assert sized_cache(hf, None, 0) == 1  # a tiny model's whole context: the 1 GB floor


def test_a_cache_set_under_one_row_of_the_context_fails_the_load_naming_what_fits(tmp_path):
    """A Llama 3.1 70B's shape (80 layers, 8 key/value heads of 128: 655,360 bytes a token in float32)
    and its 131,072 positions: 80 GB a row."""
    config = {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}
    config |= {"hidden_size": 8192, "max_position_embeddings": 131_072}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert cache_bytes_per_token(config) == 655_360
    assert sized_cache(tmp_path, None, 0) == 80 and sized_cache(tmp_path, 10_000, 0) == 7  # 6.1 GB, rounded up
    with pytest.raises(ValueError, match=r"kv_cache_gb 8 holds 13,107 tokens .* set it to 80, or .* to 13107"):
        sized_cache(tmp_path, None, 8)
    assert sized_cache(tmp_path, 13_107, 8) == 8  # what it holds, taken


def test_beam_search_opens_the_graph_at_its_first_search_and_answers_as_generate(models):
    """The ONNX graph is for beam search alone on this engine: not held in memory until one is asked for."""
    hf, version, model = models("llama")
    opened = []

    def graph() -> Graph:
        opened.append(version)
        return Graph(open_session(version / GRAPH_FILE, 1))

    steps = OpenVinoScheduler(hf, open_pipeline(version, 1, 1, 256, 16), graph).start()
    try:
        greedy, beams = Collect(), Collect()
        steps.submit(request([5, 6, 7], greedy, max_new_tokens=6))
        assert greedy.done.wait(WAIT_S) and opened == []
        steps.submit(request([4, 5, 6, 7], beams, num_beams=3, max_new_tokens=6))
        assert beams.done.wait(WAIT_S)
    finally:
        steps.close()
    assert opened == [version] and beams.error is None
    assert beams.tokens == generate(model, [4, 5, 6, 7], num_beams=3, max_new_tokens=6, do_sample=False)


def test_a_request_waiting_for_a_row_past_its_deadline_ends_while_the_row_is_taken(models):
    clock = [0.0]
    steps = scheduler(models, "llama", clock=lambda: clock[0], max_rows=1)
    running, waiting = Collect(), Collect()
    steps.submit(request([5, 6, 7], running, max_new_tokens=8))
    steps.submit(request([8, 9], waiting, deadline=2.5, max_new_tokens=8))
    for _ in range(4):  # a turn a second: the first row runs on, the second's deadline passes in the queue
        steps.turn(block=False)
        clock[0] += 1
    assert DEADLINE_MARKER in str(waiting.error) and waiting.tokens == [] and not running.done.is_set()
    turns_until_done(steps, [running])
    assert running.error is None and len(running.tokens) == 8 and steps.counts["late"] == 1
    steps.close()
