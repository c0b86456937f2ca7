"""The text_generation family's request forms and answers, parsed without Flask.

Three forms reach a text_generation model on ``/invocations`` (docs/reference/api.md):

- the envelope, ``{"modelname", "payload": {"text", ...}}`` (``clients.text_generation``), whose
  ``"stream": true`` is answered here;
- Hugging Face TGI's (and LMI's), ``{"inputs": "<text>", "parameters": {...}, "stream"}``, answered
  ``[{"generated_text"}]`` (with ``details``: TGI's details); told apart from a KServe v2 body by its
  ``inputs``, a string where v2's is a list of tensors;
- OpenAI's chat completions, ``{"model"?, "messages", "max_tokens", ...}``, answered a
  ``chat.completion``; the prompt is the folder's chat template;
- OpenAI's (legacy) completions, ``{"model"?, "prompt": str | [str], "max_tokens", ...}``, answered a
  ``text_completion``, a choice a prompt; the prompt is the text as the envelope encodes it.

A TGI, chat or completions body names its model with the custom attribute ``modelname=`` or (OpenAI's)
``model``; without either, the one text_generation model served answers it. Streamed, each answers
events (``app.router.generation_answers``): TGI's ``{"token", "generated_text", "details"}`` for the
first two forms, ``chat.completion.chunk`` or ``text_completion`` chunks then ``[DONE]`` for OpenAI's
(``app.router.streaming`` sends them). A ``null`` value is read as not given, as their clients send them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.causal_lm_contract import NO_SEED
from app.core.errors import InvalidInput
from app.core.grammar import Grammar
from clients.base import ModelClient
from clients.grammars import one_constraint, response_format, tgi_grammar
from clients.options import Option
from clients.text_generation import FAMILY_NAME, TextGenerationClient
from clients.text_stream import parse_stop
from clients.tool_calls import ToolFormat, call_grammar, check_tool_choice, check_tools

ENVELOPE, TGI, CHAT, COMPLETION = "envelope", "tgi", "chat", "completion"
# TGI's parameters that are settings; those taken at their neutral value only (huggingface_hub sends them).
TGI_SETTINGS = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
TGI_OTHERS = ("stop", "return_full_text", "details", "truncate", "grammar")
TGI_NEUTRAL = {"watermark": False, "decoder_input_details": False, "best_of": 1, "top_n_tokens": 0}
TGI_KEYS = ("inputs", "parameters", "stream")
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
CHAT_KEYS = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
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
# OpenAI's completions: the chat body's settings, a prompt for messages; n, best_of, echo and logprobs
# at their neutral value only, suffix refused
COMPLETION_KEYS = (
    *(
        key
        for key in CHAT_KEYS
        if key not in ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", *TOOL_KEYS)
    ),
    "prompt",
)
COMPLETION_NEUTRAL = {"best_of": 1, "echo": False, "logprobs": 0}
CHAT_TEMPERATURE = Option("temperature", float, 0.0, 2.0)  # OpenAI's range; 0: greedy
MAX_PROMPTS = 8  # a completions body's list of prompts: each its own row
MAX_CHOICES = 8  # OpenAI's n: choices of one prompt, each its own row
CHOICES = Option("n", int, 1, MAX_CHOICES)
TOP_LOGPROBS = Option("top_logprobs", int, 0, 20)  # OpenAI's bound


def is_generation_body(document: Mapping[str, Any]) -> bool:
    """A TGI body (``inputs`` a string), an OpenAI chat body (``messages``) or completions body
    (``prompt``), without an envelope."""
    if "modelname" in document:
        return False
    return isinstance(document.get("inputs"), str) or "messages" in document or "prompt" in document


@dataclass(frozen=True)
class GenerationCall:
    """A parsed generation request: its client and form, its prompts (the text, for
    ``return_full_text``) and their checked asks, and how it is answered."""

    client: TextGenerationClient
    form: str
    asks: tuple[Any, ...]
    prompts: tuple[str, ...]
    single: bool = True
    stream: bool = False
    return_full_text: bool = False
    details: bool = False
    include_usage: bool = False
    logprobs: bool = False  # OpenAI's chat: each token's log-probability in the answer
    tools: ToolFormat | None = None  # OpenAI's chat with tools: the markup its answers' calls are read from
    parallel_tool_calls: bool = True  # false: an answer's first call only
    version: str | None = None


def generation_client(client: ModelClient) -> TextGenerationClient:
    if not isinstance(client, TextGenerationClient):
        raise InvalidInput(
            f"model {client.name!r} is a {client.family} model: TGI's and OpenAI's bodies are for "
            f"{FAMILY_NAME} models (send it the envelope, modelname and payload)"
        )
    return client


def pick_model(name: Any, served: Callable[[], Sequence[str]]) -> Any:
    """The model a TGI or chat body names; without one, the one text_generation model served."""
    if name not in (None, ""):
        return name
    names = sorted(served())
    if len(names) == 1:
        return names[0]
    choices = (
        f"the {FAMILY_NAME} models served are {', '.join(names)}" if names else f"no {FAMILY_NAME} model is served"
    )
    raise InvalidInput(
        f"the body names no model: send modelname=<name> in X-Amzn-SageMaker-Custom-Attributes (or model, "
        f"for a chat body); {choices}"
    )


def parse_body(
    document: Mapping[str, Any],
    attributes: Mapping[str, str],
    lookup: Callable[[Any], ModelClient],
    served: Callable[[], Sequence[str]],
) -> GenerationCall:
    """A TGI or chat body (``is_generation_body``): its model (the custom attribute ``modelname``, a
    chat body's ``model``, else the one served), then the body as that model's client reads it."""
    form = CHAT if "messages" in document else COMPLETION if "prompt" in document else TGI
    name = attributes.get("modelname") or (document.get("model") if form != TGI else None)
    client = generation_client(lookup(pick_model(name, served)))
    return {CHAT: parse_chat, COMPLETION: parse_completion, TGI: parse_tgi}[form](document, client)


def streams(client: ModelClient, payload: Mapping[str, Any]) -> bool:
    """Whether an envelope's payload asks for a streamed answer (a text_generation model's)."""
    return isinstance(client, TextGenerationClient) and payload.get("stream") is True


def _given(mapping: Mapping[str, Any], keys: Sequence[str], where: str, form: str) -> dict[str, Any]:
    """The keys given a value (null: not given); any other key is refused, naming those taken."""
    given = {key: value for key, value in mapping.items() if value is not None}
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise InvalidInput(f"{where}{unknown[0]} is not taken by {form} (taken: {', '.join(keys)})")
    return given


def _flag(value: Any, where: str) -> bool:
    return Option(where, bool).parse(value, where)


def parse_tgi(document: Mapping[str, Any], client: TextGenerationClient) -> GenerationCall:
    """TGI's ``{"inputs", "parameters", "stream"}``. As TGI, a sampling setting given (temperature,
    top_k, top_p) turns sampling on; ``truncate`` keeps the prompt's last tokens; the answer keeps
    the stop sequence it ends at."""
    body = _given(document, TGI_KEYS, "", "a TGI body")
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters must be a JSON object")
    taken = (*TGI_SETTINGS, *TGI_OTHERS, *TGI_NEUTRAL)
    given = _given(parameters, taken, "parameters.", "a TGI body")
    for key, neutral in TGI_NEUTRAL.items():
        if key in given and given[key] != neutral:
            raise InvalidInput(f"parameters.{key} is not served (only {neutral!r})")
    options = {name: option.default for name, option in client.options.items()}
    for name in TGI_SETTINGS:
        if name in given:
            options[name] = client.options[name].parse(given[name], f"parameters.{name}")
    warped = (
        options["temperature"] != 1.0 and "temperature" in given
        or "top_k" in given and options["top_k"] > 0
        or "top_p" in given and options["top_p"] < 1.0
    )  # fmt: skip
    options["do_sample"] = bool(options["do_sample"]) or warped
    keep = None
    if "truncate" in given:
        keep = int(Option("truncate", int, 1, client.context - 1).parse(given["truncate"], "parameters.truncate"))
    ask = client.ask(
        client.encode_text(body.get("inputs"), "inputs"),
        options,
        "inputs",
        new_tokens="parameters.max_new_tokens",
        given="max_new_tokens" in given,
        keep=keep,
        stops=parse_stop(given.get("stop"), "parameters.stop"),
        grammar=client.grammars.encoded(
            tgi_grammar(given["grammar"]) if "grammar" in given else None, "parameters.grammar"
        ),
    )
    return GenerationCall(
        client,
        TGI,
        (ask,),
        (body["inputs"],),
        stream=_flag(body.get("stream", False), "stream"),
        return_full_text=_flag(given.get("return_full_text", False), "parameters.return_full_text"),
        details=_flag(given.get("details", False), "parameters.details"),
    )


def openai_options(body: Mapping[str, Any], client: TextGenerationClient, new_tokens: str) -> dict[str, Any]:
    """The settings of an OpenAI chat or completions body, over the model's defaults: ``temperature``
    0 is greedy, above 0 samples; a ``top_p`` under 1 or a ``top_k`` over 0 samples (vLLM's and TGI's
    ``top_k`` and ``repetition_penalty``); none given, the folder's generation config decides."""
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
    if "repetition_penalty" in body:  # transformers' (and vLLM's): a setting of the greedy search too
        options["repetition_penalty"] = client.options["repetition_penalty"].parse(
            body["repetition_penalty"], "repetition_penalty"
        )
    if "seed" in body:
        options["seed"] = client.options["seed"].parse(body["seed"], "seed")
    if "user" in body and not isinstance(body["user"], str):
        raise InvalidInput("user must be a string")
    return options


def choices(body: Mapping[str, Any], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The settings of each of OpenAI's ``n`` choices of one prompt, each its own row: with a ``seed``,
    choice ``i`` draws with ``seed + i`` (the same body answers the same choices); without one, each
    draws its own; greedy, the ``n`` choices are the same answer, as OpenAI's."""
    n = int(CHOICES.parse(body.get("n", 1), "n"))
    seed = options.get("seed")
    if seed is None or seed == NO_SEED:
        return [dict(options)] * n
    return [{**options, "seed": int(seed) + index} for index in range(n)]


def stream_settings(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """An OpenAI body's ``stream`` and ``stream_options.include_usage``."""
    usage = body.get("stream_options", {})
    if not isinstance(usage, dict) or set(usage) - {"include_usage"}:
        raise InvalidInput("stream_options takes include_usage only")
    stream = _flag(body.get("stream", False), "stream")
    if "stream_options" in body and not stream:
        raise InvalidInput("stream_options is only taken with stream true")
    return stream, _flag(usage.get("include_usage", False), "stream_options.include_usage")


def parse_completion(document: Mapping[str, Any], client: TextGenerationClient) -> GenerationCall:
    """OpenAI's completions body: ``prompt`` a text or a list of texts, ``n`` choices each (``choices``:
    each choice its own row, generated together; a prompt's choices together, in order), the chat
    body's settings; ``suffix`` refused, ``best_of``, ``echo`` and ``logprobs`` at their neutral value
    only. Streamed, one prompt and one choice."""
    if "suffix" in document and document["suffix"] is not None:
        raise InvalidInput("suffix is not served: the prompt is continued, nothing is inserted before a suffix")
    body = _given(document, (*COMPLETION_KEYS, *COMPLETION_NEUTRAL), "", "a completions body")
    for key, neutral in COMPLETION_NEUTRAL.items():
        if key in body and body[key] != neutral:
            raise InvalidInput(f"{key} is not served (only {neutral!r})")
    prompts = body.get("prompt")
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(prompts, list) or not 1 <= len(prompts) <= MAX_PROMPTS:
        raise InvalidInput(f"prompt must be a text or a list of 1 to {MAX_PROMPTS} texts")
    each = choices(body, openai_options(body, client, "max_tokens"))
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
        raise InvalidInput("stream takes one prompt and one choice: send several unstreamed, or one call each")
    return GenerationCall(
        client, COMPLETION, asks, tuple(prompts), single=len(asks) == 1, stream=stream, include_usage=include_usage
    )


def parse_chat(document: Mapping[str, Any], client: TextGenerationClient) -> GenerationCall:
    """OpenAI's chat completions body, its settings as ``openai_options`` reads them, ``n`` choices
    (``choices``; streamed, one). The answer ends before the stop sequence it stops at, as OpenAI's."""
    body = _given(document, CHAT_KEYS, "", "a chat completions body")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise InvalidInput("max_tokens and max_completion_tokens name the same limit: send one")
    new_tokens = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    each = choices(body, openai_options(body, client, new_tokens))
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
        logprobs=chat_logprobs(body),
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
    parallel = _flag(body.get("parallel_tool_calls", True), "parallel_tool_calls")
    markup = client.tool_format if tools and choice != "none" else None
    if choice in ("auto", "none") or markup is None:
        return tools or None, markup, parallel, None
    if choice == "required":  # a call of any of the tools (several, where parallel)
        return tools, markup, parallel, call_grammar(markup, tools, parallel, client.special)
    named = [tool for tool in tools if tool["function"]["name"] == choice]  # one call of that function
    return tools, markup, parallel, call_grammar(markup, named, False, client.special)


def chat_logprobs(body: Mapping[str, Any]) -> bool:
    """A chat body's ``logprobs`` (each chosen token's log-probability in the answer) and its
    ``top_logprobs``: 0 to 20 as OpenAI's, given with ``logprobs`` true; over 0 not served yet."""
    logprobs = _flag(body.get("logprobs", False), "logprobs")
    if "top_logprobs" in body:
        top = int(TOP_LOGPROBS.parse(body["top_logprobs"], "top_logprobs"))
        if not logprobs:
            raise InvalidInput("top_logprobs is taken with logprobs true")
        if top > 0:
            raise InvalidInput("top_logprobs over 0 is not served: each chosen token's log-probability is")
    return logprobs


def parse_streamed_envelope(client: TextGenerationClient, payload: Mapping[str, Any], version: str | None):
    """The envelope's payload with ``"stream": true``: one text."""
    work = client.plan(payload, version)
    item, where = work.items[0]
    ask = client.ask_payload(item, where, work.options)
    return GenerationCall(
        client,
        ENVELOPE,
        (ask,),
        (item,),
        stream=True,
        return_full_text=work.options["return_full_text"],
        version=version,
    )
