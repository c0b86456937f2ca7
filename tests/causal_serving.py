"""What the text_generation family's integration tests share, whichever engine the stack runs:
``generate``'s answer for a prompt alone, a call's result, a streamed call's events as they arrive,
and Triton's count of how the model's requests ended."""

from __future__ import annotations

import json
import time

import requests

from scripts.devtools import Stack
from tests.support import assert_conforms, post


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


def triton_metric(stack: Stack, outcome: str, model: str) -> float:
    """Triton's count of the model's text_generation requests that ended with ``outcome``."""
    text = requests.get(f"http://127.0.0.1:{stack.triton_ports[2]}/metrics", timeout=10).text
    key = f'text_generation_requests_total{{model="{model}",outcome="{outcome}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(key))
