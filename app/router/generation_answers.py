"""The text_generation family's answers in each request form (``app.router.generation_forms`` and ``app.router.openai_forms`` parse
them), whole and streamed event by event: TGI's ``[{"generated_text"}]`` and its token events; OpenAI's
``chat.completion`` and its ``chat.completion.chunk`` events; OpenAI's ``text_completion``, a choice a
prompt, and its chunks. OpenAI's streams end with ``[DONE]``."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from app.router.generation_call import CHAT, COMPLETION, GenerationCall
from clients.generation import EOS, LENGTH, Generation, Token
from clients.tool_calls import ToolCall, ToolStream, openai_calls

DONE = "[DONE]"
NO_LOGPROB = -9999.0  # OpenAI's log-probability of a token it cannot give one for
OPENAI_FINISH = {EOS: "stop", LENGTH: "length", "stop_sequence": "stop"}
TOOL_CALLS = "tool_calls"  # OpenAI's finish reason of an answer that calls tools


def _logprob(value: float) -> float | None:
    return value if math.isfinite(value) else None


def tgi_token(token: Token) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": _logprob(token.logprob), "special": token.special}


def full_text(call: GenerationCall, generation: Generation, index: int = 0) -> str:
    return call.prompts[index] + generation.text if call.return_full_text else generation.text


def tgi_details(call: GenerationCall, generation: Generation, tokens: bool = True) -> dict[str, Any]:
    details: dict[str, Any] = {
        "finish_reason": generation.finish_reason,
        "generated_tokens": len(generation.tokens),
        "seed": generation.seed,
    }
    if tokens:
        befores = [None, *(t.id for t in generation.prefill[:-1])]
        prefill = [tgi_prefill(call, t, b) for t, b in zip(generation.prefill, befores)]  # decoder_input_details
        details |= {"prefill": prefill, "tokens": [tgi_token(t) for t in generation.tokens]}
        if any(t.top for t in generation.tokens):  # TGI's top_n_tokens
            details["top_tokens"] = [[tgi_alternative(generation, *top) for top in t.top] for t in generation.tokens]
    return details


def tgi_prefill(call: GenerationCall, token: Token, before: int | None) -> dict[str, Any]:
    """A prompt token as TGI's ``details.prefill`` writes it, its text after the token ``before`` it,
    special tokens' included (the first has no log-probability: null)."""
    text = call.client.token_text(token.id, before)
    return {"id": token.id, "text": text, "logprob": _logprob(token.logprob)}


def tgi_alternative(generation: Generation, token_id: int, value: float) -> dict[str, Any]:
    """One of a token's alternatives, as TGI's ``top_tokens`` writes it."""
    special = token_id in generation.special_ids
    text = "" if special else generation.text_stream.decode([token_id])
    return {"id": token_id, "text": text, "logprob": _logprob(value), "special": special}


def tgi_answer(call: GenerationCall, generations: Sequence[Generation]) -> list[dict[str, Any]]:
    """TGI's answer, a list of one ``{"generated_text"}`` (with ``details`` when asked). With
    ``best_of``, the draw whose tokens' log-probabilities sum highest, as TGI's; the others, in that
    order, in ``details.best_of_sequences``."""
    ranked = sorted(generations, key=summed, reverse=True) if call.best else list(generations)
    answer: dict[str, Any] = {"generated_text": full_text(call, ranked[0])}
    if call.details:
        answer["details"] = tgi_details(call, ranked[0])
        if call.best:
            answer["details"]["best_of_sequences"] = [
                {"generated_text": full_text(call, other), **tgi_details(call, other)} for other in ranked[1:]
            ]
    return [answer]


def _chat_head(call: GenerationCall, ident: str, created: int, kind: str) -> dict[str, Any]:
    return {"id": ident, "object": kind, "created": created, "model": call.client.name}


def _entry(call: GenerationCall, token_id: int, value: float, before: int | None) -> dict[str, Any]:
    text = call.client.token_text(token_id, before)
    logprob = _logprob(value)
    return {"token": text, "logprob": NO_LOGPROB if logprob is None else logprob, "bytes": list(text.encode("utf-8"))}


def logprob_entry(call: GenerationCall, token: Token, before: int | None) -> dict[str, Any]:
    """One token of OpenAI's ``logprobs.content``: its text alone, its log-probability (OpenAI's -9999.0
    for none), its text's UTF-8 bytes, and the ``top_logprobs`` asked for, likeliest first."""
    entry = _entry(call, token.id, token.logprob, before)
    return {**entry, "top_logprobs": [_entry(call, *top, before) for top in token.top]}


def chat_logprobs(call: GenerationCall, tokens: Sequence[Token], before: int | None) -> dict[str, Any] | None:
    """A chat choice's ``logprobs``: each token's entry (its text after the token before it; the
    first's, after ``before``), where the body asked for them."""
    if not call.logprobs:
        return None
    befores = [before, *(token.id for token in tokens[:-1])]
    return {"content": [logprob_entry(call, token, b) for token, b in zip(tokens, befores)]}


def choices_usage(call: GenerationCall, generations: Sequence[Generation]) -> dict[str, int]:
    """OpenAI's usage of a call's choices: each prompt's tokens once (its ``n`` choices share it), every
    choice's tokens."""
    n = len(generations) // len(call.prompts)
    prompt = sum(generation.prompt_tokens for generation in generations[::n])
    completion = sum(len(generation.tokens) for generation in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def made_calls(call: GenerationCall, calls: Sequence[ToolCall]) -> list[ToolCall]:
    """The calls answered: the first only where the body asked ``parallel_tool_calls: false``."""
    return list(calls) if call.parallel_tool_calls else list(calls[:1])


def finish_reason(generation: Generation, calls: Sequence[ToolCall] = ()) -> str:
    return TOOL_CALLS if calls else OPENAI_FINISH[generation.finish_reason or LENGTH]


def chat_message(call: GenerationCall, generation: Generation) -> tuple[dict[str, Any], list[ToolCall]]:
    """The assistant's message: its text, and the tool calls read out of it where the body has tools."""
    if call.tools is None:
        return {"role": "assistant", "content": generation.text}, []
    content, calls = call.tools.split(generation.text)
    calls = made_calls(call, calls)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message[TOOL_CALLS] = openai_calls(calls, call.tools)
    return message, calls


def chat_answer(call: GenerationCall, generations: Sequence[Generation]) -> dict[str, Any]:
    """OpenAI's ``chat.completion``: a choice a row (``n``), the assistant's message (its tool calls),
    its finish reason; the usage."""
    choices = []
    for index, generation in enumerate(generations):
        message, calls = chat_message(call, generation)
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": chat_logprobs(call, generation.tokens, generation.last_prompt_id),
                "finish_reason": finish_reason(generation, calls),
            }
        )
    head = _chat_head(call, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), "chat.completion")
    return {**head, "choices": choices, "usage": choices_usage(call, generations)}


def summed(generation: Generation) -> float:
    """A generation's tokens' log-probabilities summed (TGI's best_of measure; none: the lowest)."""
    values = [token.logprob for token in generation.tokens if math.isfinite(token.logprob)]
    return sum(values) if values else -math.inf


def per_token(generation: Generation) -> float:
    """A generation's mean log-probability a token (OpenAI's best_of measure; none: the lowest)."""
    finite = sum(1 for token in generation.tokens if math.isfinite(token.logprob))
    return summed(generation) / finite if finite else -math.inf


def answered(call: GenerationCall, generations: Sequence[Generation]) -> list[Generation]:
    """The rows answered: all, or of each prompt's rows the ``call.best`` best a token, best first."""
    if not call.best:
        return list(generations)
    rows = len(generations) // len(call.prompts)
    groups = [generations[start : start + rows] for start in range(0, len(generations), rows)]
    return [g for group in groups for g in sorted(group, key=per_token, reverse=True)[: call.best]]


def completion_logprobs(
    call: GenerationCall, tokens: Sequence[Token], before: int | None, offset: int = 0
) -> dict[str, Any]:
    """A completions choice's ``logprobs`` over ``tokens``: each token's text (after the token before
    it; the first's, after ``before``), its log-probability (the prompt's first: null), its likeliest
    alternatives with the token itself (``{text: logprob}``, null for the prompt's first), and its
    text's offset in the choice's text (from ``offset``: the texts before it, summed)."""
    befores = [before, *(token.id for token in tokens[:-1])]
    texts = [call.client.token_text(token.id, b) for token, b in zip(tokens, befores)]
    offsets, tops = [], []
    for token, text, b in zip(tokens, texts, befores):
        offsets.append(offset)
        offset += len(text)
        first = not math.isfinite(token.logprob) and not token.top  # the prompt's first token
        top = {call.client.token_text(i, b): v for i, v in token.top}
        tops.append(None if first else {**top, text: token.logprob})
    return {
        "tokens": texts,
        "token_logprobs": [_logprob(token.logprob) for token in tokens],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def completion_choice(call: GenerationCall, index: int, generation: Generation, prompt: str) -> dict[str, Any]:
    """One choice of a ``text_completion``: its text (after the prompt's, with ``echo``), its
    ``logprobs`` where asked (the prompt's tokens first, with ``echo``)."""
    tokens = [*generation.prefill, *generation.tokens] if call.echo else generation.tokens
    before = None if call.echo else generation.last_prompt_id
    return {
        "index": index,
        "text": prompt + generation.text if call.echo else generation.text,
        "logprobs": completion_logprobs(call, tokens, before) if call.logprobs else None,
        "finish_reason": OPENAI_FINISH[generation.finish_reason or LENGTH],
    }


def completion_answer(call: GenerationCall, generations: Sequence[Generation]) -> dict[str, Any]:
    """OpenAI's ``text_completion``: a choice a row (a prompt's ``n`` choices together, the prompts in
    order; with ``best_of``, its best ``n``), and the usage of them all (every row drawn, as OpenAI's)."""
    rows = len(generations) // len(call.prompts)
    prompt_of = {id(generation): call.prompts[row // rows] for row, generation in enumerate(generations)}
    choices = [
        completion_choice(call, index, generation, prompt_of[id(generation)])
        for index, generation in enumerate(answered(call, generations))
    ]
    head = _chat_head(call, f"cmpl-{uuid.uuid4().hex}", int(time.time()), "text_completion")
    return {**head, "choices": choices, "usage": choices_usage(call, generations)}


def answer(call: GenerationCall, generations: Sequence[Generation]) -> Any:
    """The whole answer of a TGI, chat or completions call (a generation a prompt)."""
    if call.form == COMPLETION:
        return completion_answer(call, generations)
    return chat_answer(call, generations) if call.form == CHAT else tgi_answer(call, generations)


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
            "details": tgi_details(call, generation, tokens=False) if last and call.details else None,
        }


def chat_events(call: GenerationCall, generation: Generation, tokens: Iterator[Token]) -> Iterator[Any]:
    """OpenAI's: the assistant's role, a chunk a token that makes text, the finish reason (the usage,
    asked), then ``[DONE]``. With tools, the text that may be a call's markup is held (``ToolStream``)
    and the calls come at the end, a ``delta.tool_calls`` chunk each, as OpenAI streams them."""
    head = _chat_head(call, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), "chat.completion.chunk")
    split = ToolStream(call.tools) if call.tools is not None else None

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    before = generation.last_prompt_id
    for token in tokens:
        text = split.push(token.text) if split is not None else token.text
        if text or call.logprobs:  # asked, every token has its chunk: its log-probability
            yield chunk({"content": text}, logprobs=chat_logprobs(call, [token], before))
        before = token.id
    calls: list[ToolCall] = []
    if split is not None:
        rest, found = split.finish()
        calls = made_calls(call, found)
        if rest:
            yield chunk({"content": rest})
        for index, made in enumerate(openai_calls(calls, call.tools)):
            yield chunk({TOOL_CALLS: [{"index": index, **made}]})
    yield chunk({}, finish_reason(generation, calls))
    if call.include_usage:
        yield {**head, "choices": [], "usage": choices_usage(call, [generation])}
    yield DONE


def completion_events(call: GenerationCall, generation: Generation, tokens: Iterator[Token]) -> Iterator[Any]:
    """OpenAI's completions stream: the prompt with ``echo``, a ``text_completion`` chunk a token that
    makes text (every token, with ``logprobs``), the finish reason (the usage, asked), then ``[DONE]``."""
    head = _chat_head(call, f"cmpl-{uuid.uuid4().hex}", int(time.time()), "text_completion")
    offset, before = 0, None if call.echo else generation.last_prompt_id

    def chunk(text: str, finish: str | None = None, logprobs: Sequence[Token] = ()) -> dict[str, Any]:
        nonlocal offset, before
        found = completion_logprobs(call, logprobs, before, offset) if call.logprobs and logprobs else None
        offset += sum(len(token) for token in found["tokens"]) if found else 0
        before = logprobs[-1].id if logprobs else before
        return {**head, "choices": [{"index": 0, "text": text, "logprobs": found, "finish_reason": finish}]}

    for index, token in enumerate(tokens):
        if index == 0 and call.echo:  # the prompt first (its tokens' log-probabilities came with the first token)
            yield chunk(call.prompts[0], logprobs=generation.prefill)
        if token.text or call.logprobs:  # asked, every token has its chunk: its log-probability
            yield chunk(token.text, logprobs=[token])
    yield chunk("", OPENAI_FINISH[generation.finish_reason or LENGTH])
    if call.include_usage:
        yield {**head, "choices": [], "usage": choices_usage(call, [generation])}
    yield DONE


def tool_calls_in(data: Any) -> int:
    """The tool calls an answer (or one of its streamed events) carries: a chat answer's messages', a
    chunk's ``delta``'s."""
    if not isinstance(data, dict):
        return 0
    parts = [choice.get("message") or choice.get("delta") or {} for choice in data.get("choices", ())]
    return sum(len(part.get(TOOL_CALLS) or ()) for part in parts)
