"""The text_generation family through the whole stack (NGINX, gunicorn, the router, a real Triton whose
decoupled python-backend model batches the requests step by step over ONNX Runtime) against Hugging
Face's ``model.generate`` on the same folders: the "causal" set of scripts.model_prep.small_models, a
tiny random-weight folder of each architecture served (GPT-2, Qwen2 and Qwen3 with byte-level BPE;
Llama, Mistral and Phi-3 SentencePiece-style with byte fallback) and a small trained Llama.

Greedy and beam search answer what ``generate`` answers for that prompt alone, token for token, in
each request form; streamed, the events arrive as they are made, through NGINX, and their texts
joined are the whole answer; eight callers at once each get their own answer; a short request
joins a long generation instead of waiting for it; a caller that leaves ends its generation in
Triton; a seeded sampling request repeats itself whoever it runs beside; bad input is a 400 naming
the field and the next stream is served; boto3's ``invoke_endpoint_with_response_stream`` reads the
local stack's PayloadParts (cut small) as it reads SageMaker's."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from scripts.devtools import Stack
from scripts.model_prep.small_models.sets import SETS, Built
from tests.causal_serving import (
    assert_greedy_is_generate,
    generate,
    generate_ids,
    long_copy,
    open_stream,
    references_of,
    result,
    shared_prompt_rows,
    streamed,
    token_text,
    triton_metric,
)
from tests.references import served_copy
from tests.support import assert_error, post
from tests.tiny_causal import CALLED, PLACE, TOOLS, as_transformers_takes

pytestmark = pytest.mark.integration

# the tiny random folder of each architecture and two trained ones (each trained one's graph is held to
# generate in tests/unit/test_causal_lm_export.py)
MODELS = (*(name for name in SETS["causal"].models if name.endswith("_random")), "llama_trained", "qwen2_trained")
PROMPTS = ("The quick brown fox", "Hello there, how are", "Le café est")
LONG = "llama_long"  # llama_random with more positions: the long generations of the streaming tests
LONG_POSITIONS = 2048
TOOLS_MODEL = "qwen2_tools"  # qwen2_random (Qwen's template with tools) with room for the tools' prompt
PART_BYTES = 7  # the local response stream's PayloadParts, cut small


@pytest.fixture(scope="module")
def models(small_models: Built) -> Path:
    return small_models.models("causal")


@pytest.fixture(scope="module")
def stack(small_models: Built, tmp_path_factory, stopping: list[Stack]):
    shared = small_models.repository("causal")
    repository = served_copy(shared, MODELS, tmp_path_factory.mktemp("repository"))
    long_copy(shared, repository, "llama_random", LONG, LONG_POSITIONS)
    long_copy(shared, repository, "qwen2_random", TOOLS_MODEL, LONG_POSITIONS)
    env = {"LOCAL_STREAM_PART_BYTES": str(PART_BYTES)}
    started = Stack(repository, env_extra=env).start(tmp_path_factory.mktemp("generation-stack-logs"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


@pytest.fixture(scope="module")
def references(models: Path):
    return references_of(models, MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_answers_equal_generate_token_for_token(stack, references, name):
    assert_greedy_is_generate(stack, references, name, PROMPTS)


def test_the_trained_model_continues_its_sentence_and_beam_search_equals_generate(stack, references):
    """Greedy, the trained model ends its sentence; ``min_new_tokens`` holds its end back as
    ``generate``'s does, ``ignore_eos`` runs past it to ``max_new_tokens``; beam search is ``generate``'s."""
    found = result(stack, "llama_trained", {"text": PROMPTS[0], "max_new_tokens": 30})
    assert found["generated_text"] == generate(references, "llama_trained", PROMPTS[0], max_new_tokens=30)[1]
    assert found["finish_reason"] == "eos_token" and "lazy dog" in found["generated_text"]
    ended = found["generated_tokens"]
    held = result(stack, "llama_trained", {"text": PROMPTS[0], "max_new_tokens": 30, "min_new_tokens": ended + 3})
    wanted = generate(references, "llama_trained", PROMPTS[0], max_new_tokens=30, min_new_tokens=ended + 3)[1]
    assert held["generated_text"] == wanted and held["generated_tokens"] >= ended + 3  # the end held back
    past = result(stack, "llama_trained", {"text": PROMPTS[0], "max_new_tokens": 30, "ignore_eos": True})
    assert past["generated_tokens"] == 30 and past["finish_reason"] == "length"  # past the end it made before
    for beams in (2, 4):
        settings = {"num_beams": beams, "max_new_tokens": 10, "do_sample": False}
        found = result(stack, "llama_random", {"text": PROMPTS[1], **settings})
        assert found["generated_text"] == generate(references, "llama_random", PROMPTS[1], **settings)[1]


@pytest.mark.parametrize("name", ["qwen2_random", "llama_random"])
def test_a_chat_is_the_folders_template_then_generate(stack, references, name):
    _, tokenizer = references[name]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Où est le café?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    import torch

    model, _ = references[name]
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        new = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id or 0)
    r = post(stack, {"model": name, "messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion" and answer["model"] == name
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": tokenizer.decode(new[0, ids.shape[1] :], skip_special_tokens=True),
    }
    assert answer["usage"]["prompt_tokens"] == ids.shape[1]
    events, _, _ = streamed(
        stack, {"model": name, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    )
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == answer["choices"][0]["message"]["content"]
    # vLLM's and TGI's repetition_penalty in a chat body: generate's processor, greedy (under 1 it
    # favours what was said: llama_random's answer changes, qwen2_random's does not)
    with torch.no_grad():
        new = model.generate(
            ids, max_new_tokens=8, do_sample=False, repetition_penalty=0.2, pad_token_id=tokenizer.pad_token_id or 0
        )
    body = {"model": name, "messages": messages, "max_tokens": 8, "temperature": 0, "repetition_penalty": 0.2}
    penalised = post(stack, body).json()["choices"][0]["message"]["content"]
    assert penalised == tokenizer.decode(new[0, ids.shape[1] :], skip_special_tokens=True)
    assert (penalised != answer["choices"][0]["message"]["content"]) == (name == "llama_random")


def test_a_folder_without_a_chat_template_refuses_messages(stack):
    r = post(stack, {"model": "gpt2_random", "messages": [{"role": "user", "content": "hi"}]})
    assert_error(r, 400, "invalid_input", "chat template")


@pytest.mark.parametrize(
    "name, prompt",
    [
        ("llama_random", PROMPTS[2]),
        ("gpt2_random", PROMPTS[2]),
        ("qwen3_random", PROMPTS[2]),
        ("qwen2_trained", "Grüße aus"),  # its sentence: ü, é, û and an emoji, several byte-level pieces each
        ("llama_trained", "Tokyo is the capital"),  # 日本 as byte-fallback tokens
    ],
)
def test_streamed_events_joined_are_the_whole_answer(stack, name, prompt):
    payload = {"text": prompt, "max_new_tokens": 40, "do_sample": False}
    whole = result(stack, name, payload)["generated_text"]
    events, _, _ = streamed(stack, {"modelname": name, "payload": {**payload, "stream": True}})
    assert "".join(e["token"]["text"] for e in events) == whole == events[-1]["generated_text"]
    assert all(e["generated_text"] is None for e in events[:-1])


def test_tokens_arrive_as_they_are_made_not_at_the_end(stack):
    """Through NGINX and gunicorn, a long generation's first event arrives well before its end (a
    proxy that holds the answer back hands it over at the end), and its events come as they are
    made, in many reads, not held back to the end. The tiny model makes a token in about 2 ms: 1,000
    of them take what 200 of a small real model take. (A fifth, then a half, was asked before: on
    loaded machines the first event came at 0.29 s of 1.32 s, 0.41 s of 1.65 s, then 0.82 s of 1.15 s,
    stalls of the machine, not of the stream; the reads below are what tell a buffered answer apart.)"""
    streamed(stack, {"modelname": LONG, "payload": {"text": "hello", "max_new_tokens": 2, "stream": True}})
    body = {"modelname": LONG, "payload": {"text": "hello", "max_new_tokens": 1000, "do_sample": False, "stream": True}}
    events, times, total = streamed(stack, body)
    assert len(events) == 1000
    assert times[0] < 0.9 * total, (times[0], total)
    # spread, not held back: a buffering proxy hands the events over in a few reads at the end; here
    # they come in hundreds of reads (counted, not timed: a loaded machine stalls a generation and
    # bunches its arrivals, 82 % of the time passed at the middle event in one run)
    reads = len(set(times))
    assert reads >= 200, f"the 1000 events came in {reads} reads"
    print(f"first of 1000 events at {times[0]:.3f} s of {total:.3f} s, in {reads} reads")


def test_eight_callers_at_once_each_get_their_own_answer(stack, references):
    prompts = [f"{PROMPTS[i % 3]} {i}" for i in range(8)]
    wanted = [generate(references, "llama_trained", p, max_new_tokens=20, do_sample=False)[1] for p in prompts]

    def one(i: int) -> str:
        if i % 2:
            events, _, _ = streamed(
                stack,
                {"modelname": "llama_trained", "payload": {"text": prompts[i], "max_new_tokens": 20, "stream": True}},
            )
            return events[-1]["generated_text"]
        return result(stack, "llama_trained", {"text": prompts[i], "max_new_tokens": 20})["generated_text"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(8))) == wanted


def test_a_short_request_joins_a_long_generation_instead_of_waiting(stack):
    """Told by order, not by time (the machine may be loaded): the short request is answered while the
    long generation still has hundreds of tokens to come; had it waited for the long one to finish,
    every long event would have come before its answer."""
    long = {"modelname": LONG, "payload": {"text": "hello", "max_new_tokens": 900, "do_sample": False, "stream": True}}
    with ThreadPoolExecutor(1) as pool:
        began = time.monotonic()
        running = pool.submit(streamed, stack, long)
        time.sleep(0.1)  # the long one under way (the tiny model makes about 500 tokens a second here)
        short = result(stack, LONG, {"text": "hi", "max_new_tokens": 4})
        answered = time.monotonic() - began
        long_events, arrivals, _ = running.result()
    assert short["generated_tokens"] == 4 and len(long_events) == 900
    after = sum(arrival > answered for arrival in arrivals)
    assert after >= 100, f"only {after} of the long generation's 900 events came after the short answer"


def test_a_caller_that_leaves_ends_its_generation_in_triton(stack):
    before = triton_metric(stack, "cancelled", LONG)
    with open_stream(stack, LONG, "hello", 1000):
        pass  # the stream has begun; the caller goes away
    deadline = time.monotonic() + 20
    while triton_metric(stack, "cancelled", LONG) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert triton_metric(stack, "cancelled", LONG) == before + 1
    metrics = requests.get(f"{stack.url}/metrics", timeout=10).text
    assert f'router_generation_cancelled_total{{model="{LONG}"}}' in metrics
    # the router's thread let the request go: nothing is in flight any more
    assert "\nrouter_requests_in_flight 0.0" in metrics, [l for l in metrics.splitlines() if "in_flight" in l]
    events, _, _ = streamed(stack, {"modelname": LONG, "payload": {"text": "hi", "max_new_tokens": 5, "stream": True}})
    assert len(events) == 5


def test_a_seeded_sample_repeats_itself_whoever_it_runs_beside(stack):
    payload = {"text": PROMPTS[0], "max_new_tokens": 16, "do_sample": True, "temperature": 1.5, "seed": 7}
    alone = result(stack, "llama_random", payload)["generated_text"]
    with ThreadPoolExecutor(4) as pool:
        others = [pool.submit(result, stack, "llama_random", {**payload, "seed": s}) for s in (1, 2, 3)]
        again = result(stack, "llama_random", payload)["generated_text"]
        differing = {f.result()["generated_text"] for f in others}
    assert again == alone
    assert len(differing | {alone}) > 1


@pytest.mark.parametrize(
    "body, attributes, fragments",
    [
        ({"modelname": "llama_random", "payload": {"text": "hi", "max_new_tokens": 500}}, None, ["max_new_tokens"]),
        ({"modelname": "llama_random", "payload": {"text": "hi " * 200}}, None, ["tokens", "128"]),
        ({"modelname": "llama_random", "payload": {"text": "hi", "top_p": 1.5}}, None, ["top_p"]),
        ({"modelname": "llama_random", "payload": {"text": "hi", "temperature": -1}}, None, ["temperature"]),
        ({"inputs": "hi", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, "modelname=llama_random", ["stop"]),
        ({"model": "qwen2_random", "messages": [{"role": "wizard", "content": "hi"}]}, None, ["role"]),
        ({"model": "qwen2_random", "messages": [{"role": "user", "content": 3}]}, None, ["content"]),
        ({"modelname": "llama_random", "payload": {"text": ["a", "b"], "stream": True}}, None, ["stream"]),
    ],
    ids=["max_new_tokens", "context", "top_p", "temperature", "stop", "role", "content", "stream-list"],
)
def test_bad_input_is_a_400_and_the_next_stream_is_served(stack, body, attributes, fragments):
    r = post(stack, body, attributes=attributes)
    assert_error(r, 400, "invalid_input", *fragments)
    assert stack.ping().status_code == 200
    events, _, _ = streamed(
        stack, {"modelname": "llama_random", "payload": {"text": "hi", "max_new_tokens": 3, "stream": True}}
    )
    assert len(events) == 3


def test_boto3_reads_the_local_response_stream_as_sagemakers(stack, tmp_path, capsys):
    """invoke_endpoint_with_response_stream through NGINX: PayloadParts of 7 bytes, cutting events and
    characters, joined by the caller; ``scripts.caller invoke --stream`` prints the tokens."""
    from scripts.caller import invoke
    from scripts.caller.invoke_stream import payload_bytes
    from scripts.events import event_text, sse_events

    client = invoke.make_client(None, stack.url)
    payload = {"text": PROMPTS[2], "max_new_tokens": 30, "do_sample": False}
    response = client.invoke_endpoint_with_response_stream(
        EndpointName="local",
        ContentType="application/json",
        Body=json.dumps({"modelname": "llama_random", "payload": {**payload, "stream": True}}),
    )
    parts = list(payload_bytes(response["Body"]))
    assert max(len(p) for p in parts) == PART_BYTES and len(parts) > 30
    text = "".join(event_text(e) for e in sse_events(parts))
    assert text == result(stack, "llama_random", payload)["generated_text"]
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPTS[0])
    argv = ["--endpoint-url", stack.url, "--stream", "--option", "max_new_tokens=30", f"llama_trained={prompt}"]
    assert invoke.main(argv) == 0
    assert "jumps over the lazy dog" in capsys.readouterr().out


def test_json_lines_are_answered_whole(stack, references):
    lines = [{"modelname": "llama_trained", "payload": {"text": p, "max_new_tokens": 10}} for p in PROMPTS[:2]]
    r = requests.post(
        f"{stack.url}/invocations",
        data="\n".join(json.dumps(line) for line in lines),
        headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    answers = [json.loads(line)["result"]["generated_text"] for line in r.text.splitlines()]
    assert answers == [generate(references, "llama_trained", p, max_new_tokens=10)[1] for p in PROMPTS[:2]]


def test_the_openai_package_calls_the_local_stack_as_it_calls_openai(stack):
    """``OpenAI(base_url=".../v1")``: the same chat body answers on /v1/chat/completions as on
    /invocations, whole and streamed; /v1/models lists every served model with its family; an error is
    the package's own exception over OpenAI's error shape, and the stack keeps serving."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Où est le café?"}]
    body = {"model": "qwen2_random", "messages": messages, "max_tokens": 8, "temperature": 0}
    direct = post(stack, body).json()
    answer = client.chat.completions.create(**body)
    assert answer.object == "chat.completion" and answer.model == "qwen2_random"
    assert answer.choices[0].message.content == direct["choices"][0]["message"]["content"]
    assert answer.usage.prompt_tokens == direct["usage"]["prompt_tokens"] and answer.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(**body, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer.choices[0].message.content

    listed = {model.id: model.owned_by for model in client.models.list()}
    assert listed == dict.fromkeys([*MODELS, LONG, TOOLS_MODEL], "text_generation")

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt2_random", messages=messages)
    assert refused.value.body["code"] == "invalid_input" and "chat template" in refused.value.body["message"]
    assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):  # a path not served: a 404 in OpenAI's shape
        client.post("/responses", body={"model": "qwen2_random", "input": "hi"}, cast_to=object)
    r = requests.post(f"{stack.url}/v1/chat/completions", json={"modelname": "qwen2_random", "payload": {}}, timeout=60)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "messages" in r.json()["error"]["message"]
    assert requests.get(f"{stack.url}/ping", timeout=10).status_code == 200


def test_the_openai_package_s_completions_are_generate_s_a_choice_a_prompt(stack, references):
    """``client.completions.create``: each prompt of a list its own row, its text ``generate``'s for that
    prompt alone; streamed, the chunks joined are the whole text."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    found = client.completions.create(model="llama_random", prompt=list(PROMPTS[:2]), max_tokens=8, temperature=0)
    assert found.object == "text_completion" and [choice.index for choice in found.choices] == [0, 1]
    for prompt, choice in zip(PROMPTS, found.choices):
        assert choice.text == generate(references, "llama_random", prompt, max_new_tokens=8, do_sample=False)[1]
        assert choice.finish_reason == "length"
    assert found.usage.completion_tokens == 16
    chunks = client.completions.create(
        model="llama_random", prompt=PROMPTS[0], max_tokens=8, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == found.choices[0].text


def test_openai_s_n_seeded_choices_repeat_themselves_and_are_each_seed_s_own(stack):
    """``n`` sampled choices with a seed: the same body answers the same choices, and choice i is what
    one choice with seed + i answers (each choice its own row, whoever it runs beside)."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    body = {"model": "llama_random", "prompt": PROMPTS[1], "max_tokens": 10, "temperature": 1.0, "seed": 5}
    first = [choice.text for choice in client.completions.create(**body, n=3).choices]
    assert [choice.text for choice in client.completions.create(**body, n=3).choices] == first
    alone = [client.completions.create(**{**body, "seed": 5 + i}).choices[0].text for i in range(3)]
    assert alone == first and len(set(first)) > 1  # three draws, not one thrice
    # the prompt is run once: the later choices take the first one's keys and values (Triton's metric)
    before = shared_prompt_rows(stack, "llama_random")
    client.completions.create(**{**body, "max_tokens": 100}, n=4, extra_body={"ignore_eos": True})  # none ends early
    # 3 as a rule; under load a row that reaches the model after the others ended (rows were seen to
    # arrive up to 90 steps apart) runs it again: 2 of 30 calls read +2 beside two busy cores. The exact
    # rule is held in tests/unit/test_causal_lm_scheduler.py
    assert before + 2 <= shared_prompt_rows(stack, "llama_random") <= before + 3


def test_a_chat_s_logprobs_are_log_softmax_of_generate_s_logits(stack, references):
    """OpenAI's ``logprobs: true`` and ``top_logprobs: 5`` through the openai package: each chosen
    token's log-probability, and its five likeliest alternatives', are ``log_softmax`` of the reference
    model's logits at its position (greedy), within 1e-4."""
    import openai
    import torch

    model, tokenizer = references["llama_random"]
    messages = [{"role": "user", "content": "Où est le café?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1] :].tolist()
    wanted = [torch.log_softmax(logits[0].double(), -1)[token].item() for logits, token in zip(out.logits, new)]
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    answer = client.chat.completions.create(
        model="llama_random", messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5
    )
    content = answer.choices[0].logprobs.content
    befores = [ids[0, -1].item(), *new[:-1]]  # each token's text is what it adds after the one before
    assert [entry.token for entry in content] == [token_text(tokenizer, t, b) for t, b in zip(new, befores)]
    np.testing.assert_allclose([entry.logprob for entry in content], wanted, rtol=0, atol=1e-4)
    for entry, logits, before in zip(content, out.logits, befores):  # each token's five likeliest, likeliest first
        top = torch.log_softmax(logits[0].double(), -1).topk(5)
        texts = [token_text(tokenizer, t, before) for t in top.indices.tolist()]
        assert [alternative.token for alternative in entry.top_logprobs] == texts
        np.testing.assert_allclose([a.logprob for a in entry.top_logprobs], top.values.numpy(), rtol=0, atol=1e-4)


def test_the_openai_package_s_tools_reach_the_model_as_transformers_renders_them(stack, references, tmp_path, capsys):
    """Tools and a history of calls answered, through the openai package: the prompt is
    ``apply_chat_template(messages, tools=tools)``'s (the calls' arguments as objects), the greedy
    answer ``generate``'s from it (a random model calls no tool: its text is the answer, whole and
    streamed, and ``scripts.caller invoke --tools`` prints it); a template without tools refuses
    them, and the stack keeps serving."""
    import openai
    from transformers import AutoTokenizer

    from scripts.caller import invoke

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    tokenizer = AutoTokenizer.from_pretrained(references["qwen2_random"][1].name_or_path)
    answers = []  # the question's alone first: what scripts.caller asks below
    for messages in (CALLED[:1], CALLED):
        prompt = tokenizer.apply_chat_template(
            as_transformers_takes(messages), tools=TOOLS, add_generation_prompt=True, tokenize=False
        )
        body = {"model": TOOLS_MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 8, "temperature": 0}
        answer = client.chat.completions.create(**body)
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
        assert answer.usage.prompt_tokens == len(ids) > 128  # past qwen2_random's context: the tools' prompt
        wanted = generate_ids(references, "qwen2_random", ids, max_new_tokens=8)
        answers.append(wanted)
        assert answer.choices[0].message.content == wanted and answer.choices[0].message.tool_calls is None
        chunks = list(client.chat.completions.create(**body, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == wanted
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "question.txt").write_text(CALLED[0]["content"])
    options = ["--option", "max_tokens=8", "--option", "temperature=0", "--tools", str(tmp_path / "tools.json")]
    assert invoke.main(["--endpoint-url", stack.url, *options, f"{TOOLS_MODEL}={tmp_path / 'question.txt'}"]) == 0
    assert capsys.readouterr().out.startswith(f"{TOOLS_MODEL}:\n  {answers[0]}\n  finish_reason: ")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="llama_random", messages=CALLED[:1], tools=TOOLS)
    assert "does not take tools" in refused.value.body["message"]
    assert requests.get(f"{stack.url}/ping", timeout=10).status_code == 200


def test_every_constrained_answer_validates_against_its_schema(stack, tmp_path, capsys):
    """``response_format`` json_schema through the openai package: 16 sampled answers (2 seeds, 8 choices
    each) and a greedy one, whole and streamed, each one JSON text valid against the schema; the
    package's own ``parse`` reads a pydantic model back; TGI's regex and the envelope's schema, streamed,
    are followed too, and ``scripts.caller invoke --json-schema`` prints an answer that is valid."""
    import jsonschema
    import openai
    import pydantic

    from scripts.caller import invoke

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    body = {"model": TOOLS_MODEL, "messages": CALLED[:1], "max_tokens": 100}
    schema = {"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE, "strict": True}}
    texts = []
    for seed in range(0, 16, 8):  # choice i draws with seed + i: 16 seeds (50 a model: test_causal_lm_grammar)
        answer = client.chat.completions.create(**body, response_format=schema, temperature=1.0, seed=seed, n=8)
        assert {choice.finish_reason for choice in answer.choices} == {"stop"}  # the schema done, the model ended
        texts += [choice.message.content for choice in answer.choices]
    greedy = client.chat.completions.create(**body, response_format=schema, temperature=0)
    chunks = client.chat.completions.create(**body, response_format=schema, temperature=0, stream=True)
    joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert joined == greedy.choices[0].message.content
    for text in [*texts, joined]:
        jsonschema.validate(json.loads(text), PLACE)
    assert len(set(texts)) > 12

    class Reply(pydantic.BaseModel):
        answer: bool
        score: int = pydantic.Field(ge=0, le=9)

    parsed = client.chat.completions.parse(**body, response_format=Reply, temperature=0).choices[0].message.parsed
    assert isinstance(parsed, Reply) and 0 <= parsed.score <= 9

    r = post(stack, {"inputs": PROMPTS[0], "parameters": {"grammar": {"type": "regex", "value": "(yes|no), [0-9]{2}"}}},
             attributes="modelname=llama_random")  # fmt: skip
    assert re.fullmatch("(yes|no), [0-9]{2}", r.json()[0]["generated_text"]), r.text
    payload = {"text": PROMPTS[1], "json_schema": PLACE, "max_new_tokens": 100, "stream": True}
    events = streamed(stack, {"modelname": "llama_random", "payload": payload})[0]
    jsonschema.validate(json.loads("".join(e["token"]["text"] for e in events)), PLACE)
    (tmp_path / "place.json").write_text(json.dumps(PLACE))
    (tmp_path / "prompt.txt").write_text(PROMPTS[0])
    argv = ["--endpoint-url", stack.url, "--json-schema", str(tmp_path / "place.json")]
    assert invoke.main([*argv, "--option", "max_new_tokens=100", f"llama_random={tmp_path / 'prompt.txt'}"]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out.splitlines()[1]), PLACE)


def test_a_call_the_model_must_make_comes_back_as_tool_calls(stack):
    """``tool_choice: "required"`` and a named function: the random model's answer is a call of the
    tools, in Qwen's markup, read back as ``tool_calls`` (``finish_reason: "tool_calls"``), its arguments
    valid against the tool's parameters, whole and streamed."""
    import jsonschema
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    bounded = {"type": "object", "additionalProperties": False}  # no other key: the call ends
    city = {**bounded, "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    nothing = {**bounded, "properties": {}}
    tools = [{"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in
             (("get_weather", city), ("get_time", nothing))]  # fmt: skip
    body = {"model": TOOLS_MODEL, "messages": CALLED[:1], "tools": tools, "max_tokens": 100, "temperature": 1.0}
    parameters = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    for seed in range(4):
        answer = client.chat.completions.create(**body, tool_choice="required", seed=seed, parallel_tool_calls=False)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
        call = choice.message.tool_calls[0].function
        jsonschema.validate(json.loads(call.arguments), parameters[call.name])
    named = {"type": "function", "function": {"name": "get_time"}}
    chunks = list(client.chat.completions.create(**body, tool_choice=named, seed=1, stream=True))
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert calls and {call.function.name for call in calls} == {"get_time"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_logit_bias_and_stop_token_ids_through_the_openai_package(stack, references):
    """``logit_bias`` of +100 on a token makes it every greedy token; a ``stop_token_ids`` token ends the
    answer where ``generate``'s greedy answer has it (``extra_body``: vLLM's field)."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    body = {"model": "llama_random", "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
    biased = client.completions.create(**body, logit_bias={"100": 100})
    token = references["llama_random"][1].decode([100])
    assert biased.choices[0].text.replace(" ", "") == token.replace(" ", "") * 8 and biased.usage.completion_tokens == 8
    ids, _ = generate(references, "llama_random", PROMPTS[0], max_new_tokens=8, do_sample=False)
    at = next(i for i in range(2, 8) if ids[i] not in ids[:i])
    stopped = client.completions.create(**body, extra_body={"stop_token_ids": [ids[at]]})
    assert stopped.usage.completion_tokens == at + 1 and stopped.choices[0].finish_reason == "stop"


def test_best_of_answers_the_draws_of_highest_log_probability(stack):
    """OpenAI's ``best_of``: ``best_of`` seeded draws of the prompt (draw i with seed + i, as ``n``'s), the
    ``n`` whose tokens' mean log-probability is highest answered, best first; the usage counts every draw.
    TGI's: the same draws, the one whose tokens' log-probabilities sum highest answered, the others in
    ``details.best_of_sequences``."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    body = {"model": "llama_random", "prompt": PROMPTS[1], "max_tokens": 6, "temperature": 1.0, "seed": 3}
    found = client.completions.create(**body, best_of=4, n=2)
    draws = []  # (mean, sum, text) of each draw
    for i in range(4):  # each draw alone, through TGI's form, which answers its tokens' log-probabilities
        parameters = {"max_new_tokens": 6, "do_sample": True, "seed": 3 + i, "details": True}
        (answer,) = post(
            stack, {"inputs": PROMPTS[1], "parameters": parameters}, attributes="modelname=llama_random"
        ).json()
        logprobs = [token["logprob"] for token in answer["details"]["tokens"]]
        draws.append((sum(logprobs) / len(logprobs), sum(logprobs), answer["generated_text"]))
    best = [text for _, _, text in sorted(draws, reverse=True)[:2]]
    assert [choice.text for choice in found.choices] == best and len({text for _, _, text in draws}) > 1
    assert found.usage.completion_tokens == 4 * 6
    parameters = {"max_new_tokens": 6, "do_sample": True, "seed": 3, "details": True, "best_of": 4}
    (answer,) = post(
        stack, {"inputs": PROMPTS[1], "parameters": parameters}, attributes="modelname=llama_random"
    ).json()
    ranked = [text for _, text in sorted(((total, text) for _, total, text in draws), reverse=True)]
    others = answer["details"]["best_of_sequences"]
    assert [answer["generated_text"], *(other["generated_text"] for other in others)] == ranked
    assert sorted([answer["details"]["seed"], *(other["seed"] for other in others)]) == [3, 4, 5, 6]


@pytest.mark.parametrize("name", ["llama_random", "qwen2_random"])
def test_the_prompt_s_log_probabilities_are_log_softmax_of_the_model_s_logits(stack, references, name):
    """TGI's ``decoder_input_details`` and OpenAI completions' ``echo`` with ``logprobs: 3`` (the
    openai package): each prompt token after the first has ``log_softmax`` of the reference model's
    logits at the position before it, within 1e-4, its three likeliest too; the answer is
    ``generate``'s whichever was asked."""
    import openai
    import torch

    model, tokenizer = references[name]
    ids = tokenizer(PROMPTS[2], return_tensors="pt").input_ids
    with torch.no_grad():
        scores = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
    prompt = ids[0].tolist()
    wanted = scores[torch.arange(len(prompt) - 1), prompt[1:]].numpy()
    body = {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 4, "details": True, "decoder_input_details": True}}
    answer = post(stack, body, attributes=f"modelname={name}").json()[0]
    prefill = answer["details"]["prefill"]
    assert [token["id"] for token in prefill] == prompt and prefill[0]["logprob"] is None
    np.testing.assert_allclose([token["logprob"] for token in prefill[1:]], wanted, rtol=0, atol=1e-4)
    assert answer["generated_text"] == generate(references, name, PROMPTS[2], max_new_tokens=4, do_sample=False)[1]

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    choice = client.completions.create(
        model=name, prompt=PROMPTS[2], max_tokens=4, temperature=0, echo=True, logprobs=3
    ).choices[0]
    assert choice.text == PROMPTS[2] + answer["generated_text"]
    found = choice.logprobs
    befores = [None, *prompt[:-1]]
    assert found.tokens[: len(prompt)] == [token_text(tokenizer, t, b) for t, b in zip(prompt, befores)]
    assert "".join(found.tokens[: len(prompt)]) == tokenizer.decode(prompt)  # each piece with its spaces
    assert found.token_logprobs[0] is None and found.top_logprobs[0] is None
    np.testing.assert_allclose(found.token_logprobs[1 : len(prompt)], wanted, rtol=0, atol=1e-4)
    for position, alternatives in enumerate(found.top_logprobs[1 : len(prompt)]):
        best = scores[position].topk(3)
        before = prompt[position]
        expected = {
            token_text(tokenizer, token, before): value
            for token, value in zip(best.indices.tolist(), best.values.tolist())
        }
        assert {text: alternatives[text] for text in expected} == pytest.approx(expected, abs=1e-4)
