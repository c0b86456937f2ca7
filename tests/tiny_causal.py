"""Tiny text_generation folders for the router's tests, built with the tokenizers library alone (no
hub, no weights): a byte-level BPE (GPT-2's kind) and a SentencePiece-style BPE with byte fallback
(Llama's kind), each trained in milliseconds on a few lines that hold multi-byte characters, and a
folder around one (config.json, tokenizer_config.json with a chat template, generation_config.json,
model.toml) that the family's client reads. A stand-in for Triton's stream (``FakeGenerator``) answers
a scripted reply one token at a time."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "héllo wörld: café, naïve, über, señor. Paris is the capital of France.",
    "日本語のテキスト and 中文 text, emoji 🙂🚀 too.",
    "User: hi Assistant: hello there! The end.",
]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)


def byte_level_bpe() -> Tokenizer:
    """GPT-2's kind: byte-level pre-tokenizer and decoder, ``<|endoftext|>`` and ChatML's tokens added."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    return tokenizer


def byte_fallback_bpe() -> Tokenizer:
    """Llama's kind: "▁" for spaces, a BOS added, characters outside the vocabulary as byte tokens."""
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(
        vocab_size=160, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=40, show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    spec = json.loads(tokenizer.to_str())
    vocabulary = spec["model"]["vocab"]
    for token in bytes_:  # in the vocabulary, not added tokens: a decode keeps them
        vocabulary.setdefault(token, len(vocabulary))
    spec["model"]["byte_fallback"] = True
    spec["pre_tokenizer"] = None
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    return tokenizer


def write_folder(
    root: Path,
    name: str,
    kind: str = "byte_fallback",
    template: str | None = CHATML,
    positions: int = 64,
    generation: dict | None = None,
) -> Path:
    """A model folder ``root/name`` (model.toml, ``hf/``) of the text_generation family."""
    hf = root / name / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_fallback_bpe() if kind == "byte_fallback" else byte_level_bpe()
    tokenizer.save(str(hf / "tokenizer.json"))
    bos, eos = ("<s>", "</s>") if kind == "byte_fallback" else ("<|endoftext|>", "<|endoftext|>")
    eos_id = tokenizer.token_to_id(eos)
    model_type = "llama" if kind == "byte_fallback" else "gpt2"
    config = {"model_type": model_type, "max_position_embeddings": positions, "eos_token_id": eos_id}
    (hf / "config.json").write_text(json.dumps(config))
    settings = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if template is not None:
        settings["chat_template"] = template
    (hf / "tokenizer_config.json").write_text(json.dumps(settings))
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id, **(generation or {})}))
    (root / name / "model.toml").write_text('family = "text_generation"\n[export]\ntransformers = "hf"\n')
    return root / name


class FakeStream:
    """One request's answers: a token a response, each after ``delay`` seconds, the last with the final
    flag (``done``); ``close()`` cancels. ``fail_at``: an error raised instead of that response."""

    def __init__(self, tokens: list[int], delay: float, fail_at: int | None, error: Exception | None) -> None:
        self.tokens, self.delay, self.fail_at, self.error = tokens, delay, fail_at, error
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
        return {"token_id": np.array([token], dtype=np.int64), "logprob": np.array([-0.25], dtype=np.float32)}

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

    def stream(self, model, inputs, output_names, timeout_s=None, version=None):
        tokens = self.reply[model][: int(inputs["max_new_tokens"][0])]
        stream = FakeStream(tokens, self.delay, self.fail_at, self.error)
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
