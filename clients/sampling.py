"""A text_generation request's settings as Triton takes them, checked first: the settings that are lists
of tokens, OpenAI's ``logit_bias`` (``{"<token id>": value}``, each value -100 to 100, at most 300
tokens: the values are added to those tokens' logits before anything else) and vLLM's
``stop_token_ids`` (tokens that end the generation besides the folder's end ids, at most 16; the
answer's ``finish_reason`` at one is an end id's); what beam search and the openvino engine do not
take; and every setting as its tensor (``app.core.causal_lm_contract``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from app.core.causal_lm_contract import (
    BEAMS_NEUTRAL,
    LOGIT_BIAS,
    LOGIT_BIAS_IDS,
    MAX_BIASED_TOKENS,
    MAX_LOGIT_BIAS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    OPENVINO_NEUTRAL,
    PROMPT_LOGPROBS,
    SETTINGS,
    STOP_TOKEN_IDS,
    Setting,
)
from app.core.errors import InvalidInput
from clients.options import Option

KINDS = {"INT32": int, "INT64": int, "FP64": float, "BOOL": bool}
SEED = "seed"


def _option(setting: Setting) -> Option:
    """A contract setting as a request option (its bounds; a seed is 0 or more, none by default)."""
    kind = KINDS[setting.dtype]
    if kind is bool:
        return Option(setting.name, bool, default=setting.default)
    if setting.name == SEED:
        return Option(SEED, int, 0, setting.high)
    high = setting.high if setting.high is not None else 2**31 - 1  # top_k: bounded by the vocabulary
    return Option(setting.name, kind, setting.low, high)  # the default is the model's (option_defaults)


# every setting as the envelope's payload takes it, but the log-probabilities' alternatives and the
# prompt's, which only TGI's and OpenAI's answers carry (TOP_LOGPROBS: their bound)
OPTIONS = tuple(_option(setting) for setting in SETTINGS if setting.name not in ("top_logprobs", PROMPT_LOGPROBS))
TOP_LOGPROBS = Option("top_logprobs", int, 0, MAX_TOP_LOGPROBS)
TOKEN_LISTS = (LOGIT_BIAS, STOP_TOKEN_IDS)  # the settings that are lists (each ``()``: none)
TENSORS = (LOGIT_BIAS_IDS, LOGIT_BIAS, STOP_TOKEN_IDS)


def _token(value: Any, vocabulary: int, where: str) -> int:
    try:
        token = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    except ValueError:
        token = None
    if token is None or not 0 <= token < vocabulary:
        raise InvalidInput(f"{where}: token ids are whole numbers from 0 to {vocabulary - 1}, got {value!r}")
    return token


def logit_bias(value: Any, vocabulary: int, where: str = LOGIT_BIAS) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: an object of token ids (as strings, or numbers) to values."""
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_BIASED_TOKENS:
        raise InvalidInput(f'{where} must be an object {{"<token id>": value}} of at most {MAX_BIASED_TOKENS} tokens')
    pairs = []
    for key, bias in value.items():
        token = _token(key, vocabulary, where)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not abs(bias) <= MAX_LOGIT_BIAS:
            raise InvalidInput(f"{where}[{key!r}] must be a number from -{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}")
        pairs.append((token, float(bias)))
    return tuple(pairs)


def stop_token_ids(value: Any, vocabulary: int, where: str = STOP_TOKEN_IDS) -> tuple[int, ...]:
    """vLLM's ``stop_token_ids``: a list of token ids."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_STOP_TOKEN_IDS:
        raise InvalidInput(f"{where} must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
    return tuple(_token(token, vocabulary, where) for token in value)


def token_lists(body: Mapping[str, Any], vocabulary: int, where: str = "") -> dict[str, tuple]:
    """A body's ``logit_bias`` and ``stop_token_ids`` (``where``: the fields' prefix), checked."""
    return {
        LOGIT_BIAS: logit_bias(body.get(LOGIT_BIAS), vocabulary, f"{where}{LOGIT_BIAS}"),
        STOP_TOKEN_IDS: stop_token_ids(body.get(STOP_TOKEN_IDS), vocabulary, f"{where}{STOP_TOKEN_IDS}"),
    }


# how a refusal names a setting the caller sent under another name
ASKED_AS = {
    PROMPT_LOGPROBS: "the prompt's log-probabilities (TGI's decoder_input_details, completions' echo with logprobs)"
}


def _only(name: str, neutral: Any) -> str:
    if neutral == () or name in ASKED_AS:
        return "none"
    return f"only {neutral:g}" if isinstance(neutral, float) else f"only {neutral}"


def check_beams(options: Mapping[str, Any], where: str = "") -> None:
    """Beam search (``generate``'s) reads neither OpenAI's penalties, ``ignore_eos`` nor the token lists."""
    for name, neutral in BEAMS_NEUTRAL.items():
        if options.get(name, neutral) != neutral:
            asked = ASKED_AS.get(name, f"{where}{name}")
            raise InvalidInput(f"{asked}: beam search (num_beams > 1) takes {_only(name, neutral)}")


def check_engine(settings: Mapping[str, Any], engine: str) -> None:
    """The openvino engine takes ``OPENVINO_NEUTRAL``'s settings at their neutral value and no logit bias."""
    if engine != "openvino":
        return
    for name, neutral in {**OPENVINO_NEUTRAL, LOGIT_BIAS: ()}.items():
        if settings.get(name, neutral) != neutral:
            raise InvalidInput(
                f"{ASKED_AS.get(name, name)}: this model's engine (openvino) takes {_only(name, neutral)}"
            )


def tensors(settings: Mapping[str, Any], types: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """Every setting as its Triton tensor: a ``[1]`` each, and the token lists as theirs."""
    found = {name: np.array([value], dtype=types[name]) for name, value in settings.items() if name not in TOKEN_LISTS}
    bias = settings.get(LOGIT_BIAS, ())
    lists = ([token for token, _ in bias], [value for _, value in bias], settings.get(STOP_TOKEN_IDS, ()))
    for name, values in zip(TENSORS, lists):
        found[name] = np.asarray(values, dtype=types[name]).reshape(-1)
    return found
