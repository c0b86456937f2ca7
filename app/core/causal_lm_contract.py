"""The ``text_generation`` family's contract, shared by the router, model preparation and the Triton
model that generates (framework-free: JSON files and numbers only).

A decoder-only model (GPT-2, Llama, Qwen2/Qwen3, Mistral, Phi-3 style) is served as ONE decoupled
Triton model of the python backend (``app/triton/causal_lm_model.py``) that runs a step scheduler
over ONE exported ONNX graph, ``decoder.onnx`` (``GRAPH_FILE``): requests join the running batch at
the next step, and each generated token is sent back as it is made (Triton's gRPC stream).

The graph (``torch.onnx.export``, every batch and length axis dynamic):

- in: ``input_ids`` ``INT64 [batch, new]``, ``attention_mask`` ``INT64 [batch, past + new]``,
  ``position_ids`` ``INT64 [batch, new]`` and, for each layer ``i``, ``past.<i>.key`` and
  ``past.<i>.value`` ``FP32 [batch, kv_heads, past, head_dim]`` (``past`` may be 0: the prompt's step);
- out: ``logits`` ``FP32 [batch, vocabulary]`` (the last position only) and ``present.<i>.key`` /
  ``present.<i>.value`` ``FP32 [batch, kv_heads, past + new, head_dim]``.

The Triton model's tensors, per request (one prompt; ``max_batch_size`` 0, no batch axis):

- ``input_ids`` ``INT64 [tokens]``: the prompt, encoded by the router (chat template applied);
- one ``[1]`` tensor per setting (``SETTINGS``): ``max_new_tokens``, ``top_k``, ``num_beams``,
  ``min_new_tokens`` ``INT32``; ``temperature``, ``top_p``, ``repetition_penalty``, ``min_p``,
  ``typical_p``, ``presence_penalty``, ``frequency_penalty`` ``FP64``; ``do_sample``, ``ignore_eos``
  ``BOOL``; ``seed`` ``INT64`` (``NO_SEED``: none given, the model draws one); ``prompt_logprobs``
  ``INT32`` (``NO_PROMPT_LOGPROBS``: none; 0 or more: the prompt's log-probabilities are sent, with
  that many alternatives a position);
- ``timeout_ms`` ``INT64 [1]``: how long the generation may run; past it the stream ends with an
  error naming the deadline (``app.core.generation_contract.DEADLINE_MARKER``);
- ``grammar`` ``UINT8 [bytes]``: the constraint every token keeps to (``app.core.grammar``: a JSON
  Schema, a regex or a Lark grammar, as UTF-8 JSON); no bytes, none. A grammar that is done allows
  only the end-of-sequence tokens, so the generation ends with it; beam search takes none;
- ``logit_bias_ids`` ``INT64 [n]`` and ``logit_bias`` ``FP32 [n]``: values added to those tokens'
  logits before anything else (OpenAI's ``logit_bias``, each -100 to 100, at most 300 tokens);
  ``stop_token_ids`` ``INT64 [m]``: tokens that end the generation besides the folder's end ids (sent,
  as an end id is; ``ignore_eos`` does not hold them back); none of either: no tokens;
- out, one response per generated token: ``token_id`` ``INT64 [1]`` and ``logprob`` ``FP32 [1]``
  (the token's log-probability under the distribution it was chosen from: the scores after the
  repetition penalty, temperature, top-k and top-p). The last response carries Triton's final flag;
  with ``alternative_ids`` ``INT64 [k]`` and ``alternative_logprobs`` ``FP32 [k]``: the
  ``top_logprobs`` likeliest tokens of that distribution, likeliest first (k 0 where none is asked);
  the first response carries ``prompt_logprobs`` ``FP32 [tokens - 1]``, each prompt token's
  log-probability after the tokens before it (``log_softmax`` of the model's logits, nothing applied
  to them; the first token has none), with ``prompt_alternative_ids`` ``INT64 [(tokens - 1) * k]`` and
  ``prompt_alternative_logprobs`` ``FP32 [(tokens - 1) * k]``, the likeliest ``k`` a position (the
  setting's value), empty in every other response and where none is asked;
  a generation ends at an end-of-sequence token of the folder's generation config (sent, as
  ``generate`` returns it) or at ``max_new_tokens``. With ``num_beams`` > 1 (beam search, not
  streamed) every token comes in one response at the end, its ``token_id`` ``[tokens]`` and its
  ``logprob`` ``[tokens]`` (``generate``'s transition scores of the best beam); beam search does not
  sample: ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and ``seed`` are not read.
- errors, each a response with Triton's final flag: values the model refuses ``INVALID_ARG`` (the
  message starts with the field's name), the deadline, the model's unloading or its full waiting
  queue (``BUSY_MARKER``) ``UNAVAILABLE``, a cancelled request ``CANCELLED``, anything else ``INTERNAL``.

The model's config: decoupled (``model_transaction_policy { decoupled: true }``), ``max_batch_size``
0, and the parameter ``RUNNING_ROWS_PARAMETER`` (string, default ``MAX_RUNNING_ROWS``): how many
requests step together; the others wait for a row to end, at most ``WAITING_PARAMETER`` of them. ONNX
Runtime's intra-op threads and providers come from the parameters ``ort_intra_op_threads`` and
``ort_providers``, as text2text's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.generation_contract import TIMEOUT_MS

GRAPH_FILE = "decoder.onnx"
# [export] engine: what steps the running batch. "onnxruntime" (the default): the scheduler of
# app/triton/causal_lm_scheduler.py over GRAPH_FILE; "openvino": OpenVINO GenAI's continuous batching
# (paged attention, a prefix cache) over IR_FILE, a stateful OpenVINO IR prepared beside GRAPH_FILE
# (scripts/model_prep/causal_lm_openvino.py; beam search still runs over GRAPH_FILE).
ENGINE_KEY = "engine"
ENGINES = ("onnxruntime", "openvino")
IR_FILE = "openvino_model.xml"
# [export] weights (the openvino engine only): "fp32" (the default), "int8" (the matrix products'
# weights quantized per output channel) or "int4" (in groups of INT4_GROUPS' first size that cuts a
# product's inputs in two or more, the language-model head kept int8) at preparation
# (scripts/model_prep/causal_lm_quantize.py), which refuses them where fewer than MIN_AGREEMENT of their
# greedy next tokens are float32's on its sentences.
WEIGHTS_KEY = "weights"
WEIGHT_FORMATS = ("fp32", "int8", "int4")
INT4_GROUPS = (128, 64, 32)  # inputs sharing one int4 scale, the largest first
MIN_AGREEMENT = 0.9
# [export] min_agreement: the agreement asked for instead, 0 to 1 (a folder whose domain the check's
# sentences miss, or random weights, whose nearly flat logits int4 reorders)
MIN_AGREEMENT_KEY = "min_agreement"
IR_WEIGHTS = "openvino_model.bin"
# OpenVINO's CPU properties for float32 answers: by default it computes in bf16 where the CPU has it
# and compresses the key/value cache to u8, which changes greedy tokens.
PRECISE = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
# [export] precision (the openvino engine only): "fp32" (the default, PRECISE: greedy answers equal to
# generate's), or "bf16": bf16 arithmetic where the CPU has it (AMX, AVX-512 BF16; else OpenVINO keeps
# f32) and the key/value cache in bf16, held to float32 at preparation as int8 weights are (MIN_AGREEMENT).
PRECISION_KEY = "precision"
PRECISIONS = {"fp32": PRECISE, "bf16": {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"}}
# The key/value cache the openvino engine allocates (GB, the config.pbtxt parameter kv_cache_gb), its
# prefix cache within it, and the tokens one step may run (max_batched_tokens): the running batch is
# bounded by both, a request beyond them waits in order.
CACHE_GB_PARAMETER = "kv_cache_gb"
CACHE_GB = 1  # at least; by default as much as one row of the whole context takes (cache_gb)
GIB = 1024**3  # GenAI's cache_size unit
CACHE_VALUE_BYTES = 4  # float32 keys and values (PRECISE)
BATCHED_TOKENS_PARAMETER = "max_batched_tokens"
BATCHED_TOKENS = 2048
INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"
LOGITS_POSITIONS = "logits_positions"
LAST_POSITION = (-1,)  # a step's logits_positions where only the next token's logits are read
GRAMMAR = "grammar"
# A request's token lists: logit biases (ids and the values added to their logits before anything
# else, as OpenAI's logit_bias) and ids besides the folder's end ids that end its generation
LOGIT_BIAS_IDS, LOGIT_BIAS, STOP_TOKEN_IDS = "logit_bias_ids", "logit_bias", "stop_token_ids"
MAX_LOGIT_BIAS = 100.0  # OpenAI's -100 to 100
MAX_BIASED_TOKENS = 300  # OpenAI's bound
MAX_STOP_TOKEN_IDS = 16
TOKEN_ID, LOGPROB = "token_id", "logprob"
# each response's alternatives: the top_logprobs likeliest tokens and their log-probabilities (none: [0])
ALTERNATIVE_IDS, ALTERNATIVE_LOGPROBS = "alternative_ids", "alternative_logprobs"
# the first response's: each prompt token's log-probability, and the likeliest tokens a position (the
# setting that asks for them has the same name)
PROMPT_LOGPROBS = "prompt_logprobs"
PROMPT_ALTERNATIVE_IDS, PROMPT_ALTERNATIVE_LOGPROBS = "prompt_alternative_ids", "prompt_alternative_logprobs"
NO_PROMPT_LOGPROBS = -1
NO_SEED = -1
MAX_NEW_TOKENS = 1024  # the documented bound of max_new_tokens, also bounded by the context left
MAX_BEAMS = 8
MAX_STOP_SEQUENCES = 4  # as OpenAI's chat completions
MAX_STOP_CHARACTERS = 64  # each stop sequence's length
MAX_TEMPERATURE = 100.0
MAX_PENALTY = 100.0
MAX_TOP_LOGPROBS = 20  # OpenAI's bound of top_logprobs
MAX_OPENAI_PENALTY = 2.0  # presence_penalty and frequency_penalty: OpenAI's -2 to 2
MAX_TIMEOUT_MS = 24 * 3600 * 1000  # timeout_ms, at most (as text2text's)
RUNNING_ROWS_PARAMETER = "max_running_rows"
MAX_RUNNING_ROWS = 16
# How many requests may wait for a row beyond the running ones (the config.pbtxt parameter
# max_waiting_requests; both engines keep them in the loop's queue): one more is refused at once with an UNAVAILABLE error carrying BUSY_MARKER, which the router answers
# 429 for the caller to retry, instead of queueing without bound (TGI bounds its requests at 128).
WAITING_PARAMETER = "max_waiting_requests"
MAX_WAITING = 64
BUSY_MARKER = "the model's waiting queue is full"
# The architectures (config.json's model_type) whose export has been held to generate token for token.
ARCHITECTURES = ("gpt2", "llama", "qwen2", "qwen3", "mistral", "phi3")


@dataclass(frozen=True)
class Setting:
    """One generation setting: its tensor's Triton type, Hugging Face's default and its bounds."""

    name: str
    dtype: str
    default: Any
    low: float | None = None
    high: float | None = None


SETTINGS = (
    Setting("max_new_tokens", "INT32", 20, 1, MAX_NEW_TOKENS),  # generate's default: max_length 20
    Setting("do_sample", "BOOL", False),
    Setting("temperature", "FP64", 1.0, 1e-4, MAX_TEMPERATURE),
    Setting("top_k", "INT32", 50, 0, None),  # 0: no top-k; at most the vocabulary
    Setting("top_p", "FP64", 1.0, 1e-4, 1.0),
    Setting("repetition_penalty", "FP64", 1.0, 1e-4, MAX_PENALTY),
    Setting("num_beams", "INT32", 1, 1, MAX_BEAMS),
    Setting("seed", "INT64", NO_SEED, NO_SEED, 2**63 - 1),
    # transformers' MinPLogitsWarper and TypicalLogitsWarper (sampling only; 0 and 1: off), OpenAI's
    # presence and frequency penalties over the tokens generated (0: off), transformers'
    # MinNewTokensLengthLogitsProcessor (the end ids held back until then), and an end id that does not
    # end the generation (ignore_eos: max_new_tokens does)
    Setting("min_p", "FP64", 0.0, 0.0, 1.0),
    Setting("typical_p", "FP64", 1.0, 1e-4, 1.0),
    Setting("presence_penalty", "FP64", 0.0, -MAX_OPENAI_PENALTY, MAX_OPENAI_PENALTY),
    Setting("frequency_penalty", "FP64", 0.0, -MAX_OPENAI_PENALTY, MAX_OPENAI_PENALTY),
    Setting("min_new_tokens", "INT32", 0, 0, MAX_NEW_TOKENS),
    Setting("ignore_eos", "BOOL", False),
    # the likeliest tokens sent with each token, with their log-probabilities (OpenAI's top_logprobs)
    Setting("top_logprobs", "INT32", 0, 0, MAX_TOP_LOGPROBS),
    # the prompt's log-probabilities (TGI's decoder_input_details, OpenAI completions' echo with
    # logprobs), with that many alternatives a position
    Setting(PROMPT_LOGPROBS, "INT32", NO_PROMPT_LOGPROBS, NO_PROMPT_LOGPROBS, MAX_TOP_LOGPROBS),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)
# What the openvino engine takes at the neutral value only: GenAI has no min-p or typical-p warper, and
# its presence and frequency penalties are its own (on log-probabilities), not OpenAI's; and what beam
# search (generate's) does not read besides the sampling settings
OPENVINO_NEUTRAL = {
    "min_p": 0.0,
    "typical_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    PROMPT_LOGPROBS: NO_PROMPT_LOGPROBS,
}
BEAMS_NEUTRAL = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "ignore_eos": False,
    "top_logprobs": 0,
    PROMPT_LOGPROBS: NO_PROMPT_LOGPROBS,
    "logit_bias": (),
    "stop_token_ids": (),
}


def cache_names(layers: int, prefix: str) -> list[str]:
    """``past.<i>.key``, ``past.<i>.value`` (or ``present.``) for each layer, in order."""
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def context_length(config: Mapping[str, Any]) -> int | None:
    """The positions the model has (config.json's ``max_position_embeddings``, GPT-2's ``n_positions``)."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def cache_layout(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(layers, key/value heads, head width) of a config.json's key/value cache (GPT-2's names too)."""
    layers = int(config.get("num_hidden_layers") or config["n_layer"])
    heads = int(config.get("num_attention_heads") or config["n_head"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    hidden = int(config.get("hidden_size") or config["n_embd"])
    return layers, kv_heads, int(config.get("head_dim") or hidden // heads)


def cache_bytes_per_token(config: Mapping[str, Any]) -> int:
    """The key/value cache one token takes, every layer's keys and values in float32."""
    layers, kv_heads, head_dim = cache_layout(config)
    return 2 * layers * kv_heads * head_dim * CACHE_VALUE_BYTES


def cache_gb(per_token: int, context: int) -> int:
    """The openvino engine's ``kv_cache_gb`` where config.pbtxt does not set it: one row of the whole
    ``context`` (a prompt as long as the model takes is served), at least ``CACHE_GB``. GenAI allocates
    it as rows grow, not at once; the prefix cache keeps what rows leave within it."""
    return max(CACHE_GB, -(-per_token * context // GIB))


def cache_tokens(gb: int, per_token: int) -> int:
    """How many tokens ``gb`` of cache holds (every row's together)."""
    return gb * GIB // per_token


def defaults(generation: Mapping[str, Any]) -> dict[str, Any]:
    """Each setting's default: the folder's generation config, else Hugging Face's. ``max_length``
    counts the prompt in ``generate``; served, a folder's ``max_length`` alone keeps the default of
    20 new tokens (``max_new_tokens`` is what is read)."""
    found = {s.name: s.default for s in SETTINGS}
    for setting in SETTINGS:
        value = generation.get(setting.name)
        if setting.name == "seed":
            continue
        if setting.dtype == "BOOL":
            if isinstance(value, bool):
                found[setting.name] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found[setting.name] = int(value) if setting.dtype in ("INT32", "INT64") else float(value)
    return found


def inputs() -> list[dict[str, Any]]:
    """The Triton inputs of a text_generation model, as model.toml's ``[[inputs]]`` spell them."""
    settings = [{"name": s.name, "dtype": s.dtype, "dims": [1]} for s in SETTINGS]
    return [
        {"name": INPUT_IDS, "dtype": "INT64", "dims": [-1]},
        *settings,
        {"name": TIMEOUT_MS, "dtype": "INT64", "dims": [1]},
        {"name": GRAMMAR, "dtype": "UINT8", "dims": [-1]},
        {"name": LOGIT_BIAS_IDS, "dtype": "INT64", "dims": [-1]},
        {"name": LOGIT_BIAS, "dtype": "FP32", "dims": [-1]},
        {"name": STOP_TOKEN_IDS, "dtype": "INT64", "dims": [-1]},
    ]


def outputs() -> list[dict[str, Any]]:
    return [
        {"name": TOKEN_ID, "dtype": "INT64", "dims": [-1]},
        {"name": LOGPROB, "dtype": "FP32", "dims": [-1]},
        {"name": ALTERNATIVE_IDS, "dtype": "INT64", "dims": [-1]},
        {"name": ALTERNATIVE_LOGPROBS, "dtype": "FP32", "dims": [-1]},
        {"name": PROMPT_LOGPROBS, "dtype": "FP32", "dims": [-1]},
        {"name": PROMPT_ALTERNATIVE_IDS, "dtype": "INT64", "dims": [-1]},
        {"name": PROMPT_ALTERNATIVE_LOGPROBS, "dtype": "FP32", "dims": [-1]},
    ]
