"""The ``text2text_generation`` family's contract, shared by the router, model preparation and the
Triton model that generates (framework-free: JSON files and numbers only).

A text2text model (T5, BART, Marian, flan-t5, ...) is served as ONE Triton model of the python
backend (``app/triton/text2text_model.py``) that runs Hugging Face's own ``generate`` over three ONNX
graphs (``app/triton/onnx_generate.py``): the encoder, the decoder's first step (which also computes the
cross-attention keys and values) and the decoder's later steps (its key/value cache in, the step's
keys and values out). The router tokenizes, checks and decodes; Triton batches the callers' texts.

Its tensors, per text (one batch row each; Triton's dynamic batcher joins rows of many callers):

- ``input_ids``, ``attention_mask`` ``INT64 [tokens]``: the encoded text, padded per request;
- one ``[1]`` tensor per generation setting (``SETTINGS``): ``max_new_tokens``, ``min_new_tokens``,
  ``num_beams``, ``no_repeat_ngram_size`` ``INT32``; ``length_penalty``, ``repetition_penalty``
  ``FP64`` (the caller's number exactly, as ``generate`` takes it); ``early_stopping`` ``BOOL``;
- ``timeout_ms`` ``INT64 [1]``: how long the text's generation may run; past it the generation of
  that text stops and its request is answered an error naming the deadline (``DEADLINE_MARKER``);
- the settings and ``timeout_ms`` are optional in the config (``clients.text2text``'s
  ``optional_inputs``): a KServe v2 body may send the tokens alone, and the Triton model takes the
  folder's defaults and ``TRITON_TIMEOUT_S`` for what it leaves out (the router sends them all);
- out, ``output_ids`` ``INT64 [tokens]``: what ``generate`` returns for that text alone (the
  decoder's start token, the generated tokens, the end-of-sequence token where it ended), padded
  with ``PAD`` (-1) to the longest row of the request.

The defaults of the settings are the folder's ``generation_config.json``, then Hugging Face's
(``defaults``); the upper bounds are ``MAX_NEW_TOKENS`` (and the decoder's positions, for models with
learned positions) and ``MAX_BEAMS``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BATCH_SIZE = 16  # rows of one generate() (each beam is a row of the decoder's)
ENCODER_FILE, DECODER_INIT_FILE, DECODER_STEP_FILE = "encoder.onnx", "decoder_init.onnx", "decoder_step.onnx"
ONNX_FILES = (ENCODER_FILE, DECODER_INIT_FILE, DECODER_STEP_FILE)
OUTPUT_IDS = "output_ids"
TIMEOUT_MS = "timeout_ms"
PAD = -1  # output_ids past the end of a text's sequence
MAX_NEW_TOKENS = 512  # the documented bound of max_new_tokens (a model.toml may lower it)
MAX_BEAMS = 8  # ... and of num_beams: each beam is a row of the decoder's batch
MAX_NGRAM = 16  # no_repeat_ngram_size
MAX_PENALTY = 100.0  # length_penalty (either sign) and repetition_penalty
# The message of a generation stopped at its deadline: the router answers it as a timeout.
DEADLINE_MARKER = "generation stopped at its deadline"


@dataclass(frozen=True)
class Setting:
    """One generation setting: its tensor's Triton type, and Hugging Face's default."""

    name: str
    dtype: str
    default: Any


SETTINGS = (
    Setting("max_new_tokens", "INT32", 20),  # generate's default: 20 new tokens (max_length 20 + the start token)
    Setting("min_new_tokens", "INT32", 0),
    Setting("num_beams", "INT32", 1),
    Setting("length_penalty", "FP64", 1.0),
    Setting("early_stopping", "BOOL", False),
    Setting("no_repeat_ngram_size", "INT32", 0),
    Setting("repetition_penalty", "FP64", 1.0),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)


class GenerationSpecError(ValueError):
    """A generation_config.json that cannot be served; the message names the file and the key."""


def read_generation_config(folder: Path) -> dict[str, Any]:
    """The folder's generation settings: its generation_config.json, else (a folder saved before
    generation configs existed) its config.json, as ``from_pretrained`` reads them."""
    path = folder / "generation_config.json"
    if not path.is_file():
        path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise GenerationSpecError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise GenerationSpecError(f"{path}: expected a JSON object")
    return value


def defaults(generation: Mapping[str, Any]) -> dict[str, Any]:
    """Each setting's default: the generation config's, else Hugging Face's. ``max_length`` and
    ``min_length`` count the decoder's start token: ``max_new_tokens`` is ``max_length - 1`` where the
    config gives only that; where it gives neither, ``generate`` makes 20 new tokens."""
    found = {s.name: s.default for s in SETTINGS}
    if isinstance(generation.get("max_length"), int):
        found["max_new_tokens"] = generation["max_length"] - 1
    if isinstance(generation.get("min_length"), int):
        found["min_new_tokens"] = max(0, generation["min_length"] - 1)
    for setting in SETTINGS:
        value = generation.get(setting.name)
        if setting.dtype == "BOOL":
            if isinstance(value, bool):
                found[setting.name] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found[setting.name] = int(value) if setting.dtype == "INT32" else float(value)
    return found


def new_tokens_limit(config: Mapping[str, Any]) -> int:
    """The most tokens a request may ask for: ``MAX_NEW_TOKENS``, and fewer than the decoder's
    positions where it has learned ones (BART, Marian; T5's are relative: no bound)."""
    positions = config.get("max_position_embeddings")
    if config.get("model_type") in ("t5", "mt5", "umt5", "longt5") or not isinstance(positions, int):
        return MAX_NEW_TOKENS
    return max(1, min(MAX_NEW_TOKENS, positions - 1))


def end_ids(generation: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[int, ...]:
    """The end-of-sequence token ids (a generation config may name several)."""
    value = generation.get("eos_token_id", config.get("eos_token_id"))
    values = value if isinstance(value, list) else [value]
    return tuple(int(v) for v in values if isinstance(v, int))


def inputs() -> list[dict[str, Any]]:
    """The Triton inputs of a text2text model, as model.toml's ``[[inputs]]`` spell them."""
    text = [{"name": name, "dtype": "INT64", "dims": [-1]} for name in ("input_ids", "attention_mask")]
    settings = [{"name": s.name, "dtype": s.dtype, "dims": [1]} for s in SETTINGS]
    return [*text, *settings, {"name": TIMEOUT_MS, "dtype": "INT64", "dims": [1]}]


def outputs() -> list[dict[str, Any]]:
    return [{"name": OUTPUT_IDS, "dtype": "INT64", "dims": [-1]}]
