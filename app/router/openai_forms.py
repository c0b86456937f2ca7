"""OpenAI's request forms for a text_generation model, parsed without Flask: chat completions
(``{"model"?, "messages", "max_tokens", ...}``, the prompt the folder's chat template, with tools and
response formats) and the legacy completions (``{"model"?, "prompt": str | [str], ...}``, the prompt
the text as the envelope encodes it), each with ``n`` choices (``app.router.generation_forms`` picks
the form; ``app.router.generation_answers`` answers it). A ``null`` value is read as not given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.causal_lm_contract import MAX_TOP_LOGPROBS, NO_PROMPT_LOGPROBS, NO_SEED
from app.core.errors import InvalidInput
from app.core.grammar import Grammar
from app.router.generation_call import CHAT, COMPLETION, GenerationCall, flag, given_keys
from clients import sampling
from clients.grammars import one_constraint, response_format
from clients.options import Option
from clients.sampling import TOP_LOGPROBS
from clients.text_generation import TextGenerationClient
from clients.text_stream import parse_stop
from clients.tool_calls import ToolFormat, call_grammar, check_tool_choice, check_tools

TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
# OpenAI's penalties and vLLM's settings a chat or completions body takes as they are (min_tokens: ours
# min_new_tokens)
VLLM_SETTINGS = (
    "repetition_penalty",
    "min_p",
    "typical_p",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "ignore_eos",
    "logit_bias",
    "stop_token_ids",
)
CHAT_KEYS = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    *VLLM_SETTINGS,
    "stop",
    "seed",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
)
# OpenAI's completions: the chat body's settings, a prompt for messages, n, best_of, echo and logprobs
# (the likeliest tokens a position, as many as asked, with each token's); suffix refused
COMPLETION_KEYS = (
    *(
        key
        for key in CHAT_KEYS
        if key not in ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", *TOOL_KEYS)
    ),
    "prompt",
    "best_of",
    "echo",
    "logprobs",
)
COMPLETION_LOGPROBS = Option("logprobs", int, 0, MAX_TOP_LOGPROBS)
CHAT_TEMPERATURE = Option("temperature", float, 0.0, 2.0)  # OpenAI's range; 0: greedy
MAX_PROMPTS = 8  # a completions body's list of prompts: each its own row
MAX_CHOICES = 8  # OpenAI's n: choices of one prompt, each its own row
CHOICES = Option("n", int, 1, MAX_CHOICES)
BEST_OF = Option("best_of", int, 1, MAX_CHOICES)  # completions drawn a prompt, the n best answered


def openai_options(body: Mapping[str, Any], client: TextGenerationClient, new_tokens: str) -> dict[str, Any]:
    """The settings of an OpenAI chat or completions body, over the model's defaults: ``temperature``
    0 is greedy, above 0 samples; a ``top_p`` under 1 or a ``top_k`` over 0 samples; OpenAI's
    ``presence_penalty``, ``frequency_penalty`` and ``logit_bias``, and vLLM's ``top_k``,
    ``repetition_penalty``, ``min_p``, ``typical_p`` (read when sampling), ``min_tokens``,
    ``ignore_eos`` and ``stop_token_ids``; none given, the folder's generation config decides."""
    options = {name: option.default for name, option in client.options.items()}
    if new_tokens in body:
        options["max_new_tokens"] = client.options["max_new_tokens"].parse(body[new_tokens], new_tokens)
    if "temperature" in body:
        temperature = CHAT_TEMPERATURE.parse(body["temperature"], "temperature")
        options["do_sample"] = temperature > 0
        if temperature > 0:
            options["temperature"] = client.options["temperature"].parse(temperature, "temperature")
    if "top_p" in body:
        options["top_p"] = client.options["top_p"].parse(body["top_p"], "top_p")
        options["do_sample"] = options["do_sample"] or options["top_p"] < 1.0
    if "top_k" in body:  # as vLLM and TGI take it: a top-k over 0 samples, as top_p under 1 does
        options["top_k"] = client.options["top_k"].parse(body["top_k"], "top_k")
        options["do_sample"] = options["do_sample"] or options["top_k"] > 0
    for name in VLLM_SETTINGS:  # as vLLM takes them: min_p and typical_p when sampling, the others always
        if name in body and name not in sampling.TOKEN_LISTS:
            setting = "min_new_tokens" if name == "min_tokens" else name
            options[setting] = client.options[setting].parse(body[name], name)
    options.update(sampling.token_lists(body, client.vocabulary))
    if "seed" in body:
        options["seed"] = client.options["seed"].parse(body["seed"], "seed")
    if "user" in body and not isinstance(body["user"], str):
        raise InvalidInput("user must be a string")
    return options


def choices(body: Mapping[str, Any], options: Mapping[str, Any], rows: int | None = None) -> list[dict[str, Any]]:
    """The settings of each of OpenAI's ``n`` choices of one prompt (``rows`` of them, where more are
    drawn: ``best_of``), each its own row: with a ``seed``, choice ``i`` draws with ``seed + i`` (the
    same body answers the same choices); without one, each draws its own; greedy, the ``n`` choices are
    the same answer, as OpenAI's."""
    n = rows or int(CHOICES.parse(body.get("n", 1), "n"))
    seed = options.get("seed")
    if seed is None or seed == NO_SEED:
        return [dict(options)] * n
    return [{**options, "seed": int(seed) + index} for index in range(n)]


def stream_settings(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """An OpenAI body's ``stream`` and ``stream_options.include_usage``."""
    usage = body.get("stream_options", {})
    if not isinstance(usage, dict) or set(usage) - {"include_usage"}:
        raise InvalidInput("stream_options takes include_usage only")
    stream = flag(body.get("stream", False), "stream")
    if "stream_options" in body and not stream:
        raise InvalidInput("stream_options is only taken with stream true")
    return stream, flag(usage.get("include_usage", False), "stream_options.include_usage")


def parse_completion(document: Mapping[str, Any], client: TextGenerationClient) -> GenerationCall:
    """OpenAI's completions body: ``prompt`` a text or a list of texts, ``n`` choices each (``choices``:
    each choice its own row, generated together; a prompt's choices together, in order), or with
    ``best_of`` that many drawn a prompt and its ``n`` best answered (the highest log-probability per
    token, as OpenAI's), the chat body's settings; ``echo`` (the prompt's text before the answer's) and
    ``logprobs`` (each token's log-probability and the likeliest that many a position: the prompt's
    too, with ``echo``); ``suffix`` refused. Streamed, one prompt and one choice."""
    if "suffix" in document and document["suffix"] is not None:
        raise InvalidInput("suffix is not served: the prompt is continued, nothing is inserted before a suffix")
    body = given_keys(document, COMPLETION_KEYS, "", "a completions body")
    echo = flag(body.get("echo", False), "echo")
    top = None if body.get("logprobs") is None else int(COMPLETION_LOGPROBS.parse(body["logprobs"], "logprobs"))
    prompts = body.get("prompt")
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(prompts, list) or not 1 <= len(prompts) <= MAX_PROMPTS:
        raise InvalidInput(f"prompt must be a text or a list of 1 to {MAX_PROMPTS} texts")
    n = int(CHOICES.parse(body.get("n", 1), "n"))
    best_of = int(BEST_OF.parse(body.get("best_of", n), "best_of"))
    if best_of < n:
        raise InvalidInput(f"best_of {best_of} is under n {n}: it is how many are drawn, n how many are answered")
    asked = {} if top is None else {"top_logprobs": top, "prompt_logprobs": top if echo else NO_PROMPT_LOGPROBS}
    each = choices(body, {**openai_options(body, client, "max_tokens"), **asked}, best_of)
    stops = parse_stop(body.get("stop"), "stop")
    asks = tuple(
        client.ask(
            ids, options, "prompt", new_tokens="max_tokens", given="max_tokens" in body, stops=stops, include_stop=False
        )
        for ids in (
            client.encode_text(prompt, f"prompt[{index}]" if len(prompts) > 1 else "prompt")
            for index, prompt in enumerate(prompts)
        )
        for options in each
    )
    stream, include_usage = stream_settings(body)
    if stream and len(asks) > 1:
        raise InvalidInput("stream takes one prompt and one choice (and best_of 1): send several unstreamed")
    best = n if best_of > n else 0
    return GenerationCall(
        client, COMPLETION, asks, tuple(prompts), single=len(asks) == 1, stream=stream, include_usage=include_usage,
        best=best, logprobs=top is not None, echo=echo,
    )  # fmt: skip


def parse_chat(document: Mapping[str, Any], client: TextGenerationClient) -> GenerationCall:
    """OpenAI's chat completions body, its settings as ``openai_options`` reads them, ``n`` choices
    (``choices``; streamed, one). The answer ends before the stop sequence it stops at, as OpenAI's."""
    body = given_keys(document, CHAT_KEYS, "", "a chat completions body")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise InvalidInput("max_tokens and max_completion_tokens name the same limit: send one")
    new_tokens = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    logprobs, top = chat_logprobs(body)
    each = choices(body, {**openai_options(body, client, new_tokens), "top_logprobs": top})
    tools, markup, parallel, call = chat_tools(body, client)
    ids, stops = client.encode_chat(body.get("messages"), tools=tools), parse_stop(body.get("stop"), "stop")
    formats = {"response_format": response_format(body["response_format"]) if "response_format" in body else None}
    constraint = one_constraint({**formats, "tool_choice": call})
    grammar = client.grammars.encoded(constraint[1], constraint[0]) if constraint else b""
    asks = tuple(
        client.ask(
            ids, options, "messages", new_tokens=new_tokens, given=new_tokens in body, stops=stops, include_stop=False,
            tool_markup=markup is not None, grammar=grammar,
        )
        for options in each
    )  # fmt: skip
    stream, include_usage = stream_settings(body)
    if stream and len(asks) > 1:
        raise InvalidInput("stream takes one choice: send n over 1 unstreamed")
    return GenerationCall(
        client,
        CHAT,
        asks,
        ("",),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        tools=markup,
        parallel_tool_calls=parallel,
    )


def chat_tools(
    body: Mapping[str, Any], client: TextGenerationClient
) -> tuple[list[Any] | None, ToolFormat | None, bool, Grammar | None]:
    """A chat body's ``tools`` (checked, shown to the model through its template), the markup its
    answers' calls are read from (none under ``tool_choice: "none"``: the answer is text),
    ``parallel_tool_calls``, and the grammar of a call the model must make (``"required"``: a call of
    any of the tools, one or more where parallel; a named function: one call of it)."""
    tools = check_tools(body["tools"]) if "tools" in body else []
    choice = check_tool_choice(body.get("tool_choice", "auto" if tools else "none"), tools)
    parallel = flag(body.get("parallel_tool_calls", True), "parallel_tool_calls")
    markup = client.tool_format if tools and choice != "none" else None
    if choice in ("auto", "none") or markup is None:
        return tools or None, markup, parallel, None
    if choice == "required":  # a call of any of the tools (several, where parallel)
        return tools, markup, parallel, call_grammar(markup, tools, parallel, client.special)
    named = [tool for tool in tools if tool["function"]["name"] == choice]  # one call of that function
    return tools, markup, parallel, call_grammar(markup, named, False, client.special)


def chat_logprobs(body: Mapping[str, Any]) -> tuple[bool, int]:
    """A chat body's ``logprobs`` (each chosen token's log-probability in the answer) and its
    ``top_logprobs``: 0 to 20 as OpenAI's, given with ``logprobs`` true (each token's likeliest)."""
    logprobs = flag(body.get("logprobs", False), "logprobs")
    top = int(TOP_LOGPROBS.parse(body["top_logprobs"], "top_logprobs")) if "top_logprobs" in body else 0
    if "top_logprobs" in body and not logprobs:
        raise InvalidInput("top_logprobs is taken with logprobs true")
    return logprobs, top
