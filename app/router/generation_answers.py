"""The text_generation family's answers in each request form (``app.router.generation_forms`` parses
them), whole and streamed event by event: TGI's ``[{"generated_text"}]`` and its token events; OpenAI's
``chat.completion`` and its ``chat.completion.chunk`` events; OpenAI's ``text_completion``, a choice a
prompt, and its chunks. OpenAI's streams end with ``[DONE]``."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from app.router.generation_forms import CHAT, COMPLETION, GenerationCall
from clients.generation import EOS, LENGTH, Generation, Token

DONE = "[DONE]"
NO_LOGPROB = -9999.0  # OpenAI's log-probability of a token it cannot give one for
OPENAI_FINISH = {EOS: "stop", LENGTH: "length", "stop_sequence": "stop"}


def _logprob(value: float) -> float | None:
    return value if math.isfinite(value) else None


def tgi_token(token: Token) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": _logprob(token.logprob), "special": token.special}


def full_text(call: GenerationCall, generation: Generation, index: int = 0) -> str:
    return call.prompts[index] + generation.text if call.return_full_text else generation.text


def tgi_details(generation: Generation, tokens: bool = True) -> dict[str, Any]:
    details: dict[str, Any] = {
        "finish_reason": generation.finish_reason,
        "generated_tokens": len(generation.tokens),
        "seed": generation.seed,
    }
    if tokens:
        details |= {"prefill": [], "tokens": [tgi_token(t) for t in generation.tokens]}
    return details


def tgi_answer(call: GenerationCall, generation: Generation) -> list[dict[str, Any]]:
    """TGI's answer, a list of one ``{"generated_text"}`` (with ``details`` when asked)."""
    answer: dict[str, Any] = {"generated_text": full_text(call, generation)}
    if call.details:
        answer["details"] = tgi_details(generation)
    return [answer]


def _chat_head(call: GenerationCall, ident: str, created: int, kind: str) -> dict[str, Any]:
    return {"id": ident, "object": kind, "created": created, "model": call.client.name}


def logprob_entry(call: GenerationCall, token: Token) -> dict[str, Any]:
    """One token of OpenAI's ``logprobs.content``: its text alone, its log-probability (OpenAI's -9999.0
    for none), its text's UTF-8 bytes, no alternatives."""
    text = call.client.token_text(token.id)
    logprob = _logprob(token.logprob)
    return {
        "token": text,
        "logprob": NO_LOGPROB if logprob is None else logprob,
        "bytes": list(text.encode("utf-8")),
        "top_logprobs": [],
    }


def chat_logprobs(call: GenerationCall, tokens: Sequence[Token]) -> dict[str, Any] | None:
    """A chat choice's ``logprobs``: each token's entry, where the body asked for them."""
    return {"content": [logprob_entry(call, token) for token in tokens]} if call.logprobs else None


def choices_usage(call: GenerationCall, generations: Sequence[Generation]) -> dict[str, int]:
    """OpenAI's usage of a call's choices: each prompt's tokens once (its ``n`` choices share it), every
    choice's tokens."""
    n = len(generations) // len(call.prompts)
    prompt = sum(generation.prompt_tokens for generation in generations[::n])
    completion = sum(len(generation.tokens) for generation in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_answer(call: GenerationCall, generations: Sequence[Generation]) -> dict[str, Any]:
    """OpenAI's ``chat.completion``: a choice a row (``n``), the assistant's message, its finish reason;
    the usage."""
    choices = [
        {
            "index": index,
            "message": {"role": "assistant", "content": generation.text},
            "logprobs": chat_logprobs(call, generation.tokens),
            "finish_reason": OPENAI_FINISH[generation.finish_reason or LENGTH],
        }
        for index, generation in enumerate(generations)
    ]
    head = _chat_head(call, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), "chat.completion")
    return {**head, "choices": choices, "usage": choices_usage(call, generations)}


def completion_answer(call: GenerationCall, generations: Sequence[Generation]) -> dict[str, Any]:
    """OpenAI's ``text_completion``: a choice a row (a prompt's ``n`` choices together, the prompts in
    order), and the usage of them all."""
    choices = [
        {
            "index": index,
            "text": generation.text,
            "logprobs": None,
            "finish_reason": OPENAI_FINISH[generation.finish_reason or LENGTH],
        }
        for index, generation in enumerate(generations)
    ]
    head = _chat_head(call, f"cmpl-{uuid.uuid4().hex}", int(time.time()), "text_completion")
    return {**head, "choices": choices, "usage": choices_usage(call, generations)}


def answer(call: GenerationCall, generations: Sequence[Generation]) -> Any:
    """The whole answer of a TGI, chat or completions call (a generation a prompt)."""
    if call.form == COMPLETION:
        return completion_answer(call, generations)
    return chat_answer(call, generations) if call.form == CHAT else tgi_answer(call, generations[0])


def events(call: GenerationCall, generation: Generation, tokens: Iterator[Token]) -> Iterator[Any]:
    """The streamed answer of ``generation`` whose ``tokens`` come (its iterator, perhaps begun),
    event by event: dicts, and ``DONE`` (OpenAI's last)."""
    if call.form == COMPLETION:
        return completion_events(call, generation, tokens)
    return chat_events(call, generation, tokens) if call.form == CHAT else tgi_events(call, generation, tokens)


def tgi_events(call: GenerationCall, generation: Generation, tokens: Iterator[Token]) -> Iterator[dict[str, Any]]:
    """TGI's: one event a token, the last carrying the whole text (and, asked, the details)."""
    for index, token in enumerate(tokens):
        last = token.last
        yield {
            "index": index,
            "token": tgi_token(token),
            "generated_text": full_text(call, generation) if last else None,
            "details": tgi_details(generation, tokens=False) if last and call.details else None,
        }


def chat_events(call: GenerationCall, generation: Generation, tokens: Iterator[Token]) -> Iterator[Any]:
    """OpenAI's: the assistant's role, a chunk a token that makes text, the finish reason (the usage,
    asked), then ``[DONE]``."""
    head = _chat_head(call, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for token in tokens:
        if token.text or call.logprobs:  # asked, every token has its chunk: its log-probability
            yield chunk({"content": token.text}, logprobs=chat_logprobs(call, [token]))
    yield chunk({}, OPENAI_FINISH[generation.finish_reason or LENGTH])
    if call.include_usage:
        yield {**head, "choices": [], "usage": choices_usage(call, [generation])}
    yield DONE


def completion_events(call: GenerationCall, generation: Generation, tokens: Iterator[Token]) -> Iterator[Any]:
    """OpenAI's completions stream: a ``text_completion`` chunk a token that makes text, the finish
    reason (the usage, asked), then ``[DONE]``."""
    head = _chat_head(call, f"cmpl-{uuid.uuid4().hex}", int(time.time()), "text_completion")

    def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

    for token in tokens:
        if token.text:
            yield chunk(token.text)
    yield chunk("", OPENAI_FINISH[generation.finish_reason or LENGTH])
    if call.include_usage:
        yield {**head, "choices": [], "usage": choices_usage(call, [generation])}
    yield DONE
