"""Constrained generation in the onnxruntime engine's step loop (``app.triton.causal_lm_grammar``), on
tiny random-weight models: every answer of a JSON Schema parses and validates against it, greedy and
sampled over 50 seeds, and ends at an end-of-sequence token once the schema is done; a regex's answer
matches it; a constrained row leaves the rows beside it as ``generate`` makes them; a grammar that
cannot be followed, or one with beam search, is refused naming why."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from tokenizers import Tokenizer

from app.core.grammar import JSON_SCHEMA, REGEX, Grammar
from app.triton.causal_lm_requests import Refused
from tests.causal_scheduling import Collect, generate, request, scheduler, turns_until_done
from tests.tiny_causal import PLACE

SEEDS = 50


def answers(steps, tokenizer, grammar, settings_of, count):
    sinks = [Collect() for _ in range(count)]
    for index, sink in enumerate(sinks):
        steps.submit(request([5, 17, 99, 3], sink, grammar=grammar, max_new_tokens=100, **settings_of(index)))
    turns_until_done(steps, sinks, most=400)
    for sink in sinks:
        assert sink.error is None and sink.tokens[-1] in steps.ends  # the grammar done: the end token
    return [tokenizer.decode(sink.tokens, skip_special_tokens=True) for sink in sinks]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # byte fallback, byte-level BPE
def test_every_answer_of_a_schema_validates_greedy_and_sampled(causal_lms, graphs, kind):
    folder = causal_lms(kind)[0]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    steps = scheduler(causal_lms, graphs, kind, max_rows=16)
    grammar = Grammar(JSON_SCHEMA, PLACE)
    sampled = answers(steps, tokenizer, grammar, lambda i: {"do_sample": True, "seed": i, "top_k": 0}, SEEDS)
    greedy = answers(steps, tokenizer, grammar, lambda i: {"do_sample": False}, 1)
    for text in [*greedy, *sampled]:
        jsonschema.validate(json.loads(text), PLACE)
        assert text.startswith('{"name": ') and ", " in text  # json.dumps' separators, no other space
    assert len(set(sampled)) > SEEDS // 2  # each seed its own draw


def test_a_regex_s_answer_matches_and_the_rows_beside_it_are_generate_s(causal_lms, graphs):
    model = causal_lms("llama")[1]
    tokenizer = Tokenizer.from_file(str(causal_lms("llama")[0] / "tokenizer.json"))
    steps = scheduler(causal_lms, graphs, "llama")
    free, bound = Collect(), Collect()
    steps.submit(request([5, 6, 7], free, max_new_tokens=12))
    steps.submit(request([5, 6, 7], bound, max_new_tokens=12, grammar=Grammar(REGEX, "(yes|no), [0-9]{2}")))
    turns_until_done(steps, [free, bound])
    assert free.tokens == generate(model, [5, 6, 7], max_new_tokens=12, do_sample=False)
    assert re.fullmatch("(yes|no), [0-9]{2}", tokenizer.decode(bound.tokens, skip_special_tokens=True))


@pytest.mark.parametrize(
    ("grammar", "settings", "fragment"),
    [
        (Grammar(REGEX, "(?<=a)b"), {}, "look-around"),
        (Grammar(JSON_SCHEMA, PLACE), {"num_beams": 2}, "beam search"),
        (Grammar("lark", 'start: "a" undefined_rule'), {}, "undefined_rule"),
    ],
)
def test_a_grammar_that_cannot_be_followed_is_refused(causal_lms, graphs, grammar, settings, fragment):
    steps = scheduler(causal_lms, graphs, "llama")
    with pytest.raises(Refused, match=fragment):
        steps.submit(request([5, 6], grammar=grammar, **settings))
