"""text_generation folders for the router's tests, as the small-model set ``causal`` builds them
(``scripts.model_prep.small_models.causal``: a byte-level BPE with ChatML, Qwen2's kind; a
SentencePiece-style BPE with byte fallback, Llama's kind), and a stand-in for Triton's stream
(``FakeGenerator``) that answers a scripted reply one token at a time."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from scripts.model_prep.small_models.causal import causal_model_folder

ARCHITECTURES = {"byte_level": "qwen2", "byte_fallback": "llama"}


def write_folder(
    root: Path,
    name: str,
    kind: str = "byte_fallback",
    template: str | None = "chatml",
    positions: int = 64,
    generation: dict | None = None,
) -> Path:
    """A model folder ``root/name`` (model.toml, ``hf/``) of the text_generation family: ``kind``'s
    tokenizer, ``template`` its chat template (a name of ``causal.CHAT_TEMPLATES`` or the Jinja),
    ``positions`` its context, ``generation`` set in its ``generation_config.json``."""
    return causal_model_folder(
        root,
        name,
        ARCHITECTURES[kind],
        chat_template=template,
        files={"config.json": {"max_position_embeddings": positions}, "generation_config.json": generation or {}},
    )


class FakeStream:
    """One request's answers: a token a response, each after ``delay`` seconds, the last with the final
    flag (``done``); ``close()`` cancels. ``fail_at``: an error raised instead of that response. ``top``
    alternatives with each token: itself, then the ids after it, each 1 less likely than the one before.
    ``prompt`` (its ids and alternatives a position), the first response carries the prompt's
    log-probabilities: token i's is -i/2, its alternatives as a token's."""

    def __init__(
        self,
        tokens: list[int],
        delay: float,
        fail_at: int | None,
        error: Exception | None,
        top: int = 0,
        prompt: tuple[list[int], int] | None = None,
        logprob: float = -0.25,
    ) -> None:
        self.tokens, self.delay, self.fail_at, self.error, self.top = tokens, delay, fail_at, error, top
        self.prompt, self.logprob = prompt, logprob
        self.sent = 0
        self.done = False
        self.cancelled = False
        self.version = "1"

    def __iter__(self) -> FakeStream:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.done:
            raise StopIteration
        if self.fail_at is not None and self.sent == self.fail_at:
            self.done = True
            raise self.error
        time.sleep(self.delay)
        token = self.tokens[self.sent]
        self.sent += 1
        self.done = self.sent == len(self.tokens)
        alternatives = [token, *(token + 1 + i for i in range(self.top - 1))][: self.top]  # the chosen first
        answer = {
            "token_id": np.array([token], dtype=np.int64),
            "logprob": np.array([self.logprob], dtype=np.float32),
            "alternative_ids": np.array(alternatives, dtype=np.int64),
            "alternative_logprobs": np.array([-0.25 - i for i in range(len(alternatives))], dtype=np.float32),
        }
        if self.prompt is not None and self.sent == 1:
            ids, k = self.prompt
            answer["prompt_logprobs"] = np.array([-i / 2 for i in range(1, len(ids))], dtype=np.float32)
            tops = [[token, *(token + 1 + i for i in range(k - 1))][:k] for token in ids[1:]]
            answer["prompt_alternative_ids"] = np.array(tops, dtype=np.int64).reshape(-1)
            values = [[-i / 2 - j for j in range(k)] for i in range(1, len(ids))]
            answer["prompt_alternative_logprobs"] = np.array(values, dtype=np.float32).reshape(-1)
        return answer

    def close(self) -> None:
        if not self.done:
            self.cancelled = True
        self.done = True


class FakeGenerator:
    """Triton's stand-in for the router's text_generation tests: each stream answers ``reply`` (token
    ids), cut at ``max_new_tokens``, ending at the folder's end-of-sequence token when it is there;
    every stream and its inputs are kept."""

    def __init__(self, reply: dict[str, list[int]], delay: float = 0.0) -> None:
        self.reply = reply
        self.delay = delay
        self.streams: list[tuple[str, dict[str, np.ndarray], FakeStream]] = []
        self.fail_at: int | None = None
        self.error: Exception | None = None
        self.lock = threading.Lock()
        self.seed_logprobs: dict[int, float] = {}  # a seeded row's tokens' log-probability (else -0.25)

    def stream(self, model, inputs, output_names, timeout_s=None, version=None):
        tokens = self.reply[model][: int(inputs["max_new_tokens"][0])]
        top = int(inputs["top_logprobs"][0]) if "top_logprobs" in inputs else 0
        asked = int(inputs["prompt_logprobs"][0]) if "prompt_logprobs" in inputs else -1
        prompt = (inputs["input_ids"].tolist(), asked) if asked >= 0 else None
        logprob = self.seed_logprobs.get(int(inputs["seed"][0]) if "seed" in inputs else -1, -0.25)
        stream = FakeStream(tokens, self.delay, self.fail_at, self.error, top, prompt, logprob)
        with self.lock:
            self.streams.append((model, dict(inputs), stream))
        return stream

    def infer(self, *_, **__):
        raise AssertionError("a text_generation model is only streamed")

    def model_states(self):
        return {model: "READY" for model in self.reply}

    def server_ready(self):
        return True

    def server_live(self):
        return True


# OpenAI's tools and a history of calls answered: the chat tests' with tools
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
CALLED = [
    {"role": "user", "content": "Weather in Paris, and the time?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 °C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]


def as_transformers_takes(messages: list[dict]) -> list[dict]:
    """OpenAI's messages with each call's arguments the object its JSON string holds (what the
    templates write with tojson; the router passes them so, as vLLM does)."""
    found = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in calls
            ]
            message = {**message, "tool_calls": calls}
        found.append(message)
    return found


# A JSON Schema whose every answer is short: the constrained tests' (a random model ends it)
PLACE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}


def chat_and_genai(root: Path) -> Path:
    """``root`` with two tiny chat folders (ChatML, byte-level): ``chat`` on the onnxruntime engine,
    ``genai`` on the openvino one (what the router refuses of that engine: its model.toml says so)."""
    write_folder(root, "chat", "byte_level", "chatml", positions=64)
    folder = write_folder(root, "genai", "byte_level", "chatml", positions=64)
    spec = folder / "model.toml"
    spec.write_text(spec.read_text() + 'engine = "openvino"\n')
    return root
