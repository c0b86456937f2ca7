"""What the text_generation family's integration tests share, whichever engine the stack runs: the
reference models, ``generate``'s answer for a prompt alone, a call's result, greedy answers held to
``generate`` in our form and TGI's, a streamed call's events as they arrive, and Triton's count of
how the model's requests ended."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import requests

from scripts.devtools import Stack
from tests.support import assert_conforms, post


def references_of(models: Path, names) -> dict:
    """Each model's PyTorch model and tokenizer, from its folder's ``hf/``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return {
        name: (
            AutoModelForCausalLM.from_pretrained(models / name / "hf").eval(),
            AutoTokenizer.from_pretrained(models / name / "hf"),
        )
        for name in names
    }


def long_copy(shared: Path, repository: Path, name: str, long: str, positions: int) -> Path:
    """A copy of the prepared model ``name`` as ``long``, with ``positions`` of context: a Llama's
    positions are rotary, computed in the graph (and the IR), so the same graph serves a longer context
    (the long generations of the streaming and cancelling tests)."""
    folder = repository / long
    shutil.copytree(shared / name, folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{name}"', f'name: "{long}"'))
    for file, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        path = folder / "hf" / file
        path.write_text(json.dumps({**json.loads(path.read_text()), key: positions}))
    return folder


def generate(references, name: str, prompt: str, **settings) -> tuple[list[int], str]:
    """``generate``'s new tokens for ``prompt`` alone, and their text (special tokens skipped)."""
    import torch

    model, tokenizer = references[name]
    encoded = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**encoded, pad_token_id=tokenizer.pad_token_id or 0, **settings)[0]
    new = ids[encoded.input_ids.shape[1] :].tolist()
    return new, tokenizer.decode(new, skip_special_tokens=True)


def result(stack: Stack, model: str, payload: dict):
    r = post(stack, {"modelname": model, "payload": payload})
    assert_conforms(r, "/invocations", "POST")
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


def streamed(stack: Stack, body: dict, attributes: str | None = None) -> tuple[list, list[float], float]:
    """A streamed call's events, each one's arrival in seconds after the request was sent, and the whole time."""
    headers = {"Content-Type": "application/json"}
    if attributes:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = attributes
    start = time.monotonic()
    with requests.post(f"{stack.url}/invocations", json=body, headers=headers, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text[:500]
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers.get("Transfer-Encoding") == "chunked"
        events, times, pending = [], [], b""
        for chunk in r.iter_content(chunk_size=None):
            pending += chunk
            while b"\n\n" in pending:
                raw, pending = pending.split(b"\n\n", 1)
                data = raw.decode()[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
                times.append(time.monotonic() - start)
    return events, times, time.monotonic() - start


def open_stream(stack: Stack, model: str, text: str, new: int, began: bool = True) -> socket.socket:
    """A streamed generation sent over a raw connection (closing it is a caller who leaves); with
    ``began``, returned once its first event has arrived."""
    body = json.dumps({"modelname": model, "payload": {"text": text, "max_new_tokens": new, "stream": True}})
    connection = socket.create_connection(("127.0.0.1", stack.port), timeout=30)
    head = f"POST /invocations HTTP/1.1\r\nHost: local\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    connection.sendall(head.encode() + body.encode())
    received = b""
    while began and b"data: " not in received:  # the headers may come alone, the first event after them
        chunk = connection.recv(4096)
        assert chunk, received
        received += chunk
    return connection


def triton_lines(stack: Stack, model: str, prefix: str) -> dict[str, float]:
    """Triton's metric lines of ``model`` that start with ``prefix``: each one's value by its name and labels."""
    text = requests.get(f"http://127.0.0.1:{stack.triton_ports[2]}/metrics", timeout=10).text
    return {
        line.rsplit(" ", 1)[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(prefix) and f'model="{model}"' in line
    }


def triton_metric(stack: Stack, outcome: str, model: str) -> float:
    """Triton's count of the model's text_generation requests that ended with ``outcome``."""
    text = requests.get(f"http://127.0.0.1:{stack.triton_ports[2]}/metrics", timeout=10).text
    key = f'text_generation_requests_total{{model="{model}",outcome="{outcome}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(key))


def token_text(tokenizer, token: int, before: int | None) -> str:
    """A token's text as OpenAI's logprobs write it: what it adds to the decode after the token before
    it (a SentencePiece token keeps its leading space), else its decode alone."""
    alone = tokenizer.decode([token])
    if before is None:
        return alone
    head, pair = tokenizer.decode([before]), tokenizer.decode([before, token])
    return pair[len(head) :] if pair.startswith(head) and len(pair) > len(head) else alone


def shared_prompt_rows(stack: Stack, model: str) -> float:
    """Triton's count of the model's rows whose prompt another row ran for them."""
    text = requests.get(f"http://127.0.0.1:{stack.triton_ports[2]}/metrics", timeout=10).text
    key = f'text_generation_shared_prompt_rows_total{{model="{model}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(key))


def assert_greedy_is_generate(stack: Stack, references, name: str, prompts) -> list[tuple[list[int], str]]:
    """Greedy answers to ``prompts`` in our form, and to the first in TGI's with its tokens' ids, are
    ``generate``'s (12 new tokens); ``generate``'s answers, for more checks."""
    wanted = [generate(references, name, p, max_new_tokens=12, do_sample=False) for p in prompts]
    answers = result(stack, name, {"text": list(prompts), "max_new_tokens": 12, "do_sample": False})
    assert [a["generated_text"] for a in answers] == [text for _, text in wanted]
    tgi = requests.post(
        f"{stack.url}/invocations",
        json={"inputs": prompts[0], "parameters": {"max_new_tokens": 12, "do_sample": False, "details": True}},
        headers={"X-Amzn-SageMaker-Custom-Attributes": f"modelname={name}"},
        timeout=60,
    )
    assert tgi.status_code == 200, tgi.text
    [answer] = tgi.json()
    assert [t["id"] for t in answer["details"]["tokens"]] == wanted[0][0]
    assert answer["generated_text"] == wanted[0][1]
    return wanted


def generate_ids(references, name: str, ids: list[int], **settings) -> str:
    """``generate``'s greedy text after the prompt ``ids``."""
    import torch

    model, tokenizer = references[name]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, pad_token_id=tokenizer.pad_token_id or 0, **settings)
    return tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
