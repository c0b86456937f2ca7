"""The chat benchmark's model and repository, prepared by ``scripts.model_prep`` in this process.

Realistic (the default): ``bench_llama``, a Llama of about 34M parameters (``LlamaConfig``: width
384, feed-forward 1024, 6 layers, 6 query heads of 64 sharing 2 key/value heads, 2,048 positions,
untied input and output embeddings of 32,000 tokens: Llama 2's vocabulary, so the language-model
head, a ``384 x 32,000`` product each step of every row, costs what a small Llama's does) with
seeded random weights, and a tokenizer of Llama's kind (``LlamaTokenizerFast``: a SentencePiece-style
BPE with byte fallback, ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<s>`` put before each prompt) trained
here on sentences of the text benchmark's words, its vocabulary padded with dummy pieces (``▁zq<n>``:
no merge makes them, so no prompt is cut into them, and a generated one decodes to `` zq<n>``) up
to 32,000 entries: every id the model may choose decodes. Its chat template is ChatML with tools
(Qwen's, ``CHAT_TEMPLATE``): the tool-calling row's chat bodies are rendered by it.

The ``</s>`` row of ``lm_head`` is zero: its logit is 0 at every step, below the largest of the
other 31,999 random logits, so greedy search never ends a generation early and every generation
makes exactly ``max_new_tokens`` (the endpoint's bodies have no ``min_new_tokens``; the benchmark
counts each answer's tokens and reports tokens a call).

The folder is built once (``models/bench_llama/hf``, kept while its ``BUILD`` stamp matches), and
model preparation's ``--cache-dir`` keeps the ONNX export of those bytes: a second run exports nothing.

``--small``: the tiny Llama of ``scripts.model_prep.small_models`` (two layers of width 32,
``SMALL_POSITIONS`` positions), a smoke run.
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

from app.core.causal_lm_contract import (
    ENGINE_KEY,
    ENGINES,
    MIN_AGREEMENT_KEY,
    PRECISION_KEY,
    WEIGHT_FORMATS,
    WEIGHTS_KEY,
)
from app.core.spec import ModelSpec
from clients.text_generation import FAMILY_NAME
from scripts.bench import prepared
from scripts.bench.chat import plan
from scripts.bench.chat.plan import MODEL
from scripts.bench.generation.prepare import corpus
from scripts.bench.text.prepare import write_model_toml
from scripts.model_prep.small_models.causal import CHAT_TEMPLATES

SEED = 0
# the chat template (scripts.model_prep.small_models.causal's, with tools: the tool-calling row's chat bodies)
CHAT_TEMPLATE = "qwen_tools"
SMALL_POSITIONS = 1024  # --small: room for the tools' prompt (about 600 tiny-BPE tokens) and the generations
VOCABULARY = 32_000  # Llama 2's
TRAINED_PIECES = 2000  # the BPE's vocabulary before the padding (specials and the 256 bytes included)
SPECIALS = ["<unk>", "<s>", "</s>"]  # Llama's ids 0, 1, 2
DUMMY = "\u2581zq{}"  # a padding piece: "▁zq<n>"
ARCHITECTURE = {
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
# --shape smollm2: SmolLM2-135M's sizes (its config.json; tied embeddings of 49,152 tokens), 135M parameters
SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
}
# --shape llama-580m-32k: real sizes (weights over 2 GB in float32, a 32,768-token context), 580M parameters
LLAMA_580M = {
    "hidden_size": 1536,
    "intermediate_size": 4096,
    "num_hidden_layers": 20,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 32_768,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
}
SHAPES = dict(zip(plan.SHAPES, ((ARCHITECTURE, VOCABULARY), (SMOLLM2, 49_152), (LLAMA_580M, 49_152))))


def build_of(shape: str) -> str:
    """What the folder of ``shape`` is built from (its BUILD stamp)."""
    architecture, vocabulary = SHAPES[shape]
    return json.dumps(
        {
            "seed": SEED,
            "vocabulary": vocabulary,
            "trained": TRAINED_PIECES,
            "eos_row": 0,
            "chat_template": CHAT_TEMPLATE,
            **architecture,
        }
    )


def padded_vocabulary(trained: dict[str, int], size: int = VOCABULARY) -> dict[str, int]:
    """The trained pieces at their ids, then dummy pieces up to ``size`` entries."""
    found = dict(sorted(trained.items(), key=lambda item: item[1]))
    if list(found.values()) != list(range(len(found))):
        raise ValueError("the trained vocabulary's ids are not 0 .. n-1")
    return found | {DUMMY.format(i): len(found) + i for i in range(size - len(found))}


def llama_tokenizer(size: int = VOCABULARY, positions: int = ARCHITECTURE["max_position_embeddings"]):
    """LlamaTokenizerFast on a byte-fallback BPE trained on ``corpus()``, padded to ``size`` pieces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_PIECES,
        min_frequency=1,
        special_tokens=[*SPECIALS, *(f"<0x{byte:02X}>" for byte in range(256))],
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return LlamaTokenizerFast(
        vocab=padded_vocabulary(model["vocab"], size),
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        model_max_length=positions,
    )


def llama_folder(folder: Path, shape: str = plan.SHAPES[0]) -> Path:
    """A ``save_pretrained`` folder of the Llama of ``shape`` with seeded random weights, the ``</s>``
    row of ``lm_head`` zero (tied: of the embeddings too; ``</s>`` is never an input), greedy search by
    default, and its tokenizer (padding: ``<unk>``, as many Llama folders)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    architecture, vocabulary = SHAPES[shape]
    tokenizer = llama_tokenizer(vocabulary, architecture["max_position_embeddings"])
    tokenizer.pad_token = tokenizer.unk_token
    tokenizer.chat_template = CHAT_TEMPLATES[CHAT_TEMPLATE]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **architecture,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    generation = model.generation_config
    generation.do_sample, generation.num_beams = False, 1
    generation.bos_token_id, generation.eos_token_id = config.bos_token_id, config.eos_token_id
    generation.pad_token_id = config.pad_token_id
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def serving_toml(engine: str, weights: str, precision: str = "fp32") -> str:
    """model.toml's [export] lines for the engine, the weights and the arithmetic (none for the defaults);
    with int4 weights, no agreement with float32 asked for."""
    lines = [f'{ENGINE_KEY} = "{engine}"'] if engine != ENGINES[0] else []
    lines += [f'{WEIGHTS_KEY} = "{weights}"'] if weights != WEIGHT_FORMATS[0] else []
    lines += [f'{PRECISION_KEY} = "{precision}"'] if precision != "fp32" else []
    if weights == "int4":  # random weights' flat logits: int4 flips many of their greedy choices (42% kept)
        lines += [f"{MIN_AGREEMENT_KEY} = 0.0  # random weights: the agreement is printed, not asked for"]
    return "".join(f"{line}\n" for line in lines)


def model_source(
    models: Path,
    small: bool,
    shape: str = plan.SHAPES[0],
    engine: str = ENGINES[0],
    weights: str = "fp32",
    precision: str = "fp32",
):
    """``models/bench_llama`` with its model.toml (the engine, weights and arithmetic asked for) and
    ``hf/`` folder of ``shape``, built unless already there."""
    model = models / MODEL
    extra = serving_toml(engine, weights, precision)
    if small:
        from scripts.model_prep.small_models.causal import causal_model_folder

        if not (model / "hf" / "chat_template.jinja").is_file():
            positions = {
                "config.json": {"max_position_embeddings": SMALL_POSITIONS},
                "tokenizer_config.json": {"model_max_length": SMALL_POSITIONS},
            }
            causal_model_folder(models, MODEL, "llama", seed=SEED, chat_template=CHAT_TEMPLATE, files=positions)
        write_model_toml(model, FAMILY_NAME, extra=extra)
        return model
    size = dict(zip(plan.SHAPES, ("about 34M", "about 135M (SmolLM2-135M's shape)", "about 580M")))[shape]
    prepared.kept_or_built(
        model,
        build_of(shape),
        f"a Llama of {size} parameters, random weights, a padded BPE",
        partial(llama_folder, shape=shape),
    )
    write_model_toml(model, FAMILY_NAME, extra=extra)
    return model


def prepare_repository(out: Path, repository: Path, small: bool, **serving: str) -> Path:
    """The model's source in ``out/models`` (its exports cached in ``out/cache``), prepared into
    ``repository``; ``serving``: ``model_source``'s shape, engine, weights and precision."""
    return prepared.prepare_repository(out, repository, MODEL, SEED, small, partial(model_source, **serving))


def ready(out: Path, repository: Path, small: bool, build: bool, **serving: str) -> ModelSpec:
    """The served model's spec, its repository prepared first (unless ``build`` is False: served as it is)."""
    return prepared.ready(
        out,
        repository,
        MODEL,
        small,
        (lambda: prepare_repository(out, repository, small, **serving)) if build else None,
    )
