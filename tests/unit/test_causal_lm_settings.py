"""The sampling settings beyond transformers' classic four, in the onnxruntime engine's step loop, on
tiny random-weight models: ``min_p`` and ``typical_p`` draw what ``generate`` draws with the same seed
(transformers' MinPLogitsWarper and TypicalLogitsWarper), ``min_new_tokens`` holds the end ids back as
``generate``'s MinNewTokensLengthLogitsProcessor does, ``ignore_eos`` runs past an end id to
``max_new_tokens``, OpenAI's presence and frequency penalties are OpenAI's definition over the tokens
generated, ``logit_bias`` is ``generate``'s ``sequence_bias`` of single tokens, ``stop_token_ids`` end
the row; beam search refuses what it would not read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.triton.causal_lm_requests import Refused
from app.triton.causal_lm_scheduler import Scheduler
from app.triton.causal_lm_tokens import OpenAIPenalties, processors
from tests.causal_scheduling import (
    Collect,
    drawn,
    ending_at_a_new_token,
    generate,
    request,
    scheduler,
    turns_until_done,
)

NEUTRAL = {"repetition_penalty": 1.0, "do_sample": False, "min_new_tokens": 0}


@pytest.mark.parametrize("settings", [{"min_p": 0.05}, {"typical_p": 0.8}, {"min_p": 0.02, "top_k": 0}])
def test_min_p_and_typical_p_draw_what_generate_draws(causal_lms, graphs, settings):
    model = causal_lms("llama")[1]
    sampling = {"do_sample": True, "max_new_tokens": 12, **settings}
    found = drawn(lambda: scheduler(causal_lms, graphs, "llama"), [12, 40, 41], 11, sampling)
    torch.manual_seed(11)
    tokens, scores = generate(model, [12, 40, 41], True, **sampling)
    assert found.tokens == tokens
    wanted = torch.log_softmax(scores, -1)[torch.arange(len(tokens)), tokens]
    np.testing.assert_allclose(found.logprobs, wanted.numpy(), atol=1e-4)


def test_openai_s_penalties_are_openai_s_definition_over_the_tokens_generated():
    scores = torch.randn(1, 10, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[3, 3, 4, 3, 3, 5, 7]])  # a prompt of 3 tokens, then 3, 3, 5, 7
    settings = {**NEUTRAL, "presence_penalty": 0.5, "frequency_penalty": -0.3, "min_p": 0.0, "typical_p": 1.0}
    (penalties,) = processors(settings, prompt_length=3)
    counts = np.bincount([3, 3, 5, 7], minlength=10)  # OpenAI: mu[j] - c[j] * a_freq - (c[j] > 0) * a_pres
    wanted = scores[0].numpy() - counts * -0.3 - (counts > 0) * 0.5
    np.testing.assert_allclose(penalties(ids, scores.clone())[0].numpy(), wanted, rtol=0, atol=1e-6)


def test_a_greedy_row_with_penalties_is_generate_with_them(causal_lms, graphs):
    model = causal_lms("qwen2")[1]
    prompt, given = [7, 7, 8, 9, 7], {"presence_penalty": 1.5, "frequency_penalty": 0.7}
    steps, sink = scheduler(causal_lms, graphs, "qwen2"), Collect()
    steps.submit(request(prompt, sink, max_new_tokens=15, **given))
    turns_until_done(steps, [sink])
    penalties = [OpenAIPenalties(len(prompt), 1.5, 0.7)]
    assert sink.tokens == generate(model, prompt, max_new_tokens=15, do_sample=False, logits_processor=penalties)
    assert sink.tokens != generate(model, prompt, max_new_tokens=15, do_sample=False)  # they changed the answer


def test_min_new_tokens_holds_the_end_back_and_ignore_eos_runs_past_it(causal_lms, graphs, tmp_path):
    prompt = [20, 21, 22]
    model, end, free = ending_at_a_new_token(causal_lms, tmp_path, prompt)
    steps = Scheduler(tmp_path, graphs["llama"])
    held, past = Collect(), Collect()
    steps.submit(request(prompt, held, max_new_tokens=12, min_new_tokens=10))
    steps.submit(request(prompt, past, max_new_tokens=12, ignore_eos=True))
    turns_until_done(steps, [held, past])
    assert held.tokens == generate(model, prompt, max_new_tokens=12, min_new_tokens=10, eos_token_id=[end, 2])
    assert end not in held.tokens[:10] and free.index(end) < 10
    assert past.tokens == free and end in past.tokens[:-1] and past.lasts[-1]  # past the end, to max_new_tokens


def test_logit_bias_is_generate_s_sequence_bias_and_a_stop_token_ends_the_row(causal_lms, graphs):
    model = causal_lms("gpt2")[1]
    prompt = [7, 8, 9]
    free = generate(model, prompt, max_new_tokens=10, do_sample=False)
    bias = {free[0]: -100.0, 33: 4.5, free[2]: 2.0}  # the first token barred; two others favoured
    steps, biased, stopped = scheduler(causal_lms, graphs, "gpt2"), Collect(), Collect()
    steps.submit(request(prompt, biased, max_new_tokens=10, logit_bias=tuple(bias.items())))
    steps.submit(request(prompt, stopped, max_new_tokens=10, stop_token_ids=(free[3],)))
    turns_until_done(steps, [biased, stopped])
    sequence_bias = {(token,): value for token, value in bias.items()}
    assert biased.tokens == generate(model, prompt, max_new_tokens=10, do_sample=False, sequence_bias=sequence_bias)
    assert biased.tokens[0] != free[0]
    assert stopped.tokens == free[: free.index(free[3]) + 1] and stopped.lasts[-1]  # the stop token sent, as an end's


def test_token_lists_out_of_their_bounds_are_refused(causal_lms, graphs):
    steps = scheduler(causal_lms, graphs, "llama")
    for lists, fragment in (
        ({"logit_bias": ((10**6, 1.0),)}, "logit_bias: token ids are from 0"),
        ({"logit_bias": ((5, 101.0),)}, "logit_bias: each value is from -100 to 100"),
        ({"stop_token_ids": tuple(range(17))}, "stop_token_ids 16"),
    ):
        with pytest.raises(Refused, match=fragment):
            steps.submit(request([5, 6], **lists))


def test_beam_search_refuses_what_it_would_not_read(causal_lms, graphs):
    steps = scheduler(causal_lms, graphs, "llama")
    given = (("presence_penalty", 0.5), ("frequency_penalty", 1.0), ("ignore_eos", True), ("logit_bias", ((5, 1.0),)))
    for name, value in (*given, ("stop_token_ids", (5,))):
        with pytest.raises(Refused, match=f"{name}: beam search"):
            steps.submit(request([5, 6], num_beams=2, **{name: value}))


@pytest.mark.parametrize("settings", [{"do_sample": False}, {"do_sample": True, "top_k": 20}])
def test_each_token_s_alternatives_are_the_likeliest_of_its_distribution(causal_lms, graphs, settings):
    model = causal_lms("qwen2")[1]
    prompt = [11, 12, 13]
    found = drawn(
        lambda: scheduler(causal_lms, graphs, "qwen2"), prompt, 4, {**settings, "max_new_tokens": 6, "top_logprobs": 5}
    )
    torch.manual_seed(4)
    tokens, scores = generate(
        model, prompt, True, **{k: v for k, v in settings.items() if k != "seed"}, max_new_tokens=6
    )
    assert found.tokens == tokens
    wanted = torch.log_softmax(scores, -1).topk(5, dim=-1)
    for (ids, values), top_ids, top_values in zip(found.alternatives, wanted.indices, wanted.values):
        assert ids.tolist() == top_ids.tolist()
        np.testing.assert_allclose(values, top_values.numpy(), rtol=0, atol=1e-4)
    assert all(
        len(ids) == 0
        for ids, _ in drawn(
            lambda: scheduler(causal_lms, graphs, "qwen2"), prompt, 4, {"max_new_tokens": 2}
        ).alternatives
    )
