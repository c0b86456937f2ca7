"""The text_generation family's request forms, parsed without Flask: which form a body is, its model,
and the envelope's and TGI's forms (OpenAI's: ``app.router.openai_forms``).

Four forms reach a text_generation model on ``/invocations`` (docs/reference/api.md):

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
from typing import Any

from app.core.errors import InvalidInput
from app.router.generation_call import CHAT, COMPLETION, ENVELOPE, TGI, GenerationCall, flag, given_keys
from app.router.openai_forms import BEST_OF, choices, parse_chat, parse_completion
from clients.base import ModelClient
from clients.grammars import tgi_grammar
from clients.options import Option
from clients.sampling import TOP_LOGPROBS
from clients.text_generation import FAMILY_NAME, TextGenerationClient
from clients.text_stream import parse_stop

# TGI's parameters that are settings; those taken at their neutral value only (huggingface_hub sends them).
TGI_SETTINGS = (
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "seed",
)
TGI_OTHERS = (
    "stop",
    "return_full_text",
    "details",
    "truncate",
    "grammar",
    "top_n_tokens",
    "decoder_input_details",
    "best_of",
)
TGI_NEUTRAL = {"watermark": False}
TGI_KEYS = ("inputs", "parameters", "stream")


def is_generation_body(document: Mapping[str, Any]) -> bool:
    """A TGI body (``inputs`` a string), an OpenAI chat body (``messages``) or completions body
    (``prompt``), without an envelope."""
    if "modelname" in document:
        return False
    return isinstance(document.get("inputs"), str) or "messages" in document or "prompt" in document


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


def parse_tgi(document: Mapping[str, Any], client: TextGenerationClient) -> GenerationCall:
    """TGI's ``{"inputs", "parameters", "stream"}``. As TGI, a sampling setting given (temperature,
    top_k, top_p) turns sampling on; ``truncate`` keeps the prompt's last tokens; the answer keeps
    the stop sequence it ends at; ``best_of`` (sampled, unstreamed) draws that many rows of the prompt
    (with a ``seed``, row i draws with ``seed + i``) and answers the one of highest log-probability,
    the others in ``details.best_of_sequences``."""
    body = given_keys(document, TGI_KEYS, "", "a TGI body")
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters must be a JSON object")
    taken = (*TGI_SETTINGS, *TGI_OTHERS, *TGI_NEUTRAL)
    given = given_keys(parameters, taken, "parameters.", "a TGI body")
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
        or "typical_p" in given and options["typical_p"] < 1.0
    )  # fmt: skip
    options["do_sample"] = bool(options["do_sample"]) or warped
    if "top_n_tokens" in given:  # each token's likeliest, in details.top_tokens
        options["top_logprobs"] = TOP_LOGPROBS.parse(given["top_n_tokens"], "parameters.top_n_tokens")
    details = flag(given.get("details", False), "parameters.details")
    stream = flag(body.get("stream", False), "stream")
    if flag(given.get("decoder_input_details", False), "parameters.decoder_input_details"):
        if not details or stream:  # as TGI's: the prompt's tokens are in details.prefill, never streamed
            raise InvalidInput(
                "parameters.decoder_input_details: the prompt's tokens come in a whole answer's details.prefill: "
                "send details true and stream false with it"
            )
        options["prompt_logprobs"] = 0
    best_of = int(BEST_OF.parse(given.get("best_of", 1), "parameters.best_of"))
    if best_of > 1 and (stream or not options["do_sample"]):  # as TGI's
        raise InvalidInput(
            "parameters.best_of: draws that many and answers the likeliest, so it samples (do_sample, or a "
            "temperature, top_k, top_p or typical_p) and is not streamed"
        )
    keep = None
    if "truncate" in given:
        keep = int(Option("truncate", int, 1, client.context - 1).parse(given["truncate"], "parameters.truncate"))
    ids = client.encode_text(body.get("inputs"), "inputs")
    stops = parse_stop(given.get("stop"), "parameters.stop")
    grammar = client.grammars.encoded(
        tgi_grammar(given["grammar"]) if "grammar" in given else None, "parameters.grammar"
    )
    asks = tuple(
        client.ask(
            ids, each, "inputs", new_tokens="parameters.max_new_tokens", given="max_new_tokens" in given, keep=keep,
            stops=stops, grammar=grammar,
        )
        for each in choices(given, options, best_of)
    )  # fmt: skip
    return GenerationCall(
        client,
        TGI,
        asks,
        (body["inputs"],),
        single=len(asks) == 1,
        best=1 if best_of > 1 else 0,
        stream=stream,
        return_full_text=flag(given.get("return_full_text", False), "parameters.return_full_text"),
        details=details,
    )


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
