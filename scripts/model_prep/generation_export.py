"""A ``text2text_generation`` model's export: a Hugging Face encoder-decoder folder to the three ONNX
graphs ``generate`` runs on (``app.core.generation_contract``), checked, and its Triton model for any target.

``torch.onnx.export(dynamo=False, opset 17)`` of three small wrappers around
``AutoModelForSeq2SeqLM``, every batch and sequence axis dynamic:

- ``encoder.onnx``: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``;
- ``decoder_init.onnx``: ``decoder_input_ids``, ``encoder_hidden_states``, ``encoder_attention_mask``
  -> ``logits`` and ``present.{self,cross}.<layer>.{key,value}`` (the first step fills the cache);
- ``decoder_step.onnx``: the same and ``past.{self,cross}.<layer>.{key,value}`` -> ``logits`` and the
  step's own ``present.self.<layer>.{key,value}``.

The checks, as for the other exports: ``onnx.checker`` on each graph; ONNX Runtime against torch
(the encoder's states, each decoder graph's logits at a padded batch of two, the step at a past of
three tokens), the max difference printed; then ``generate`` itself, greedy and beam search, driven
over ONNX Runtime (``app.triton.onnx_generate``) against the PyTorch model's, token for token.

A wrapper module is made in training mode and the export restores the wrapper's mode when it ends,
which would switch the wrapped model to training (dropout on): each wrapper is ``.eval()``-ed before
its export and the model after it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core.generation_contract import DECODER_INIT_FILE, DECODER_STEP_FILE, ENCODER_FILE, ONNX_FILES
from app.core.spec import ModelSpec
from app.triton import TEXT2TEXT_MODEL
from app.triton.onnx_generate import (
    DECODER_INPUTS,
    ENCODER_INPUTS,
    HIDDEN,
    KINDS,
    LOGITS,
    cache_names,
    generation_config,
)
from scripts.model_prep import weights
from scripts.model_prep.onnx_export import OPSET, REPORT_FILE, ExportError, sha256_of
from scripts.model_prep.recipes import Tolerance

TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
CHECK_TEXTS = 2  # the batch of the checks: the second text shorter (padded)
CHECK_TOKENS = 12
PAST_TOKENS = 3  # the decoder step is checked after this many tokens
CHECK_NEW_TOKENS = 8
CHECKED = "generate() equal, greedy and beam"  # what the checks held, printed after the diffs


def layers_of(model: nn.Module) -> int:
    config = model.config
    return int(getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", None) or 0)


class Encoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def decoded(model: nn.Module, ids, hidden, mask, cache):
    """The decoder's logits for ``ids`` given the encoder's states and mask; ``cache`` is updated."""
    return model(
        decoder_input_ids=ids, encoder_outputs=(hidden,), attention_mask=mask, past_key_values=cache, use_cache=True
    ).logits


class DecoderInit(nn.Module):
    """The first step: the cache starts empty and leaves with every layer's keys and values."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.layers = model, layers_of(model)

    def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        logits = decoded(self.model, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, cache)
        own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
        flat = []
        for layer in range(self.layers):
            flat += [own[layer].keys, own[layer].values, cross[layer].keys, cross[layer].values]
        return (logits, *flat)


class DecoderStep(nn.Module):
    """A later step: the cache in; the logits and the step's own self-attention keys and values out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.layers = model, layers_of(model)

    def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, *past):
        from transformers.cache_utils import EncoderDecoderCache

        cache = EncoderDecoderCache(tuple(tuple(past[4 * i : 4 * i + 4]) for i in range(self.layers)))
        steps = decoder_input_ids.shape[1]
        logits = decoded(self.model, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, cache)
        own = cache.self_attention_cache.layers
        flat = []
        for layer in range(self.layers):
            flat += [own[layer].keys[:, :, -steps:], own[layer].values[:, :, -steps:]]
        return (logits, *flat)


def load_model(spec: ModelSpec, choice: weights.WeightsChoice) -> nn.Module:
    """The folder's model with its own weights, or seeded random ones of its config."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    folder = str(spec.text.folder)
    try:
        if choice.source == weights.FILE:
            model = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager")
        else:
            torch.manual_seed(choice.seed)
            config = AutoConfig.from_pretrained(folder)
            model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager")
    except (OSError, ValueError) as error:
        raise ExportError(
            f"[{spec.name}] {folder}: transformers cannot load it as a text2text model: {error}"
        ) from None
    if not getattr(model.config, "is_encoder_decoder", False) or layers_of(model) == 0:
        raise ExportError(f"[{spec.name}] {folder}: not an encoder-decoder model (T5, BART, Marian, ...)")
    model.generation_config = generation_config(spec.text.folder)  # random weights: still the folder's settings
    return model.eval()


def sample(model: nn.Module, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of the vocabulary (past its first few, the special ones), the second row padded."""
    vocabulary = int(model.config.vocab_size)
    ids = torch.from_numpy(rng.integers(min(5, vocabulary - 1), vocabulary, size=(CHECK_TEXTS, CHECK_TOKENS)))
    mask = torch.ones_like(ids)
    mask[1:, CHECK_TOKENS // 2 :] = 0
    ids[1:, CHECK_TOKENS // 2 :] = int(model.config.pad_token_id or 0)
    return ids, mask


def _export(module: nn.Module, model: nn.Module, args: tuple, path: Path, names: tuple, axes: dict) -> None:
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values taken as constants
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(names[0]),
            output_names=list(names[1]),
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    module.eval()
    model.eval()


def export(model: nn.Module, folder: Path, rng: np.random.Generator) -> None:
    """The three graphs into ``folder``."""
    layers = layers_of(model)
    ids, mask = sample(model, rng)
    batch, source = {0: "batch"}, {0: "batch", 1: "source"}
    _export(
        Encoder(model),
        model,
        (ids, mask),
        folder / ENCODER_FILE,
        (ENCODER_INPUTS, ("last_hidden_state",)),
        {"input_ids": source, "attention_mask": source, "last_hidden_state": source},
    )
    with torch.no_grad():
        hidden = Encoder(model).eval()(ids, mask)
    start = torch.full((len(ids), 1), int(model.config.decoder_start_token_id or 0))
    decoder_axes = {
        "decoder_input_ids": {0: "batch", 1: "steps"},
        HIDDEN: source,
        "encoder_attention_mask": source,
        LOGITS: {0: "batch", 1: "steps"},
    }
    present = cache_names(layers, "present")
    _export(
        DecoderInit(model),
        model,
        (start, hidden, mask),
        folder / DECODER_INIT_FILE,
        (DECODER_INPUTS, (LOGITS, *present)),
        {**decoder_axes, **{n: {**batch, 2: "steps" if ".self." in n else "source"} for n in present}},
    )
    with torch.no_grad():
        past = DecoderInit(model).eval()(start, hidden, mask)[1:]
    past_names = cache_names(layers, "past")
    own = cache_names(layers, "present", KINDS[:2])
    _export(
        DecoderStep(model),
        model,
        (start, hidden, mask, *past),
        folder / DECODER_STEP_FILE,
        ((*DECODER_INPUTS, *past_names), (LOGITS, *own)),
        {
            **decoder_axes,
            **{n: {**batch, 2: "past" if ".self." in n else "source"} for n in past_names},
            **{n: {**batch, 2: "steps"} for n in own},
        },
    )


def _difference(name: str, reference: torch.Tensor, found: np.ndarray, diffs: dict, limits: dict) -> None:
    reference = reference.detach().numpy()
    if reference.shape != found.shape:
        raise ExportError(f"ONNX Runtime gives {name} the shape {list(found.shape)}, torch {list(reference.shape)}")
    diffs[name] = float(np.max(np.abs(reference.astype(np.float64) - found.astype(np.float64))))
    limits[name] = TOLERANCE.limit(reference)


def check(spec: ModelSpec, model: nn.Module, folder: Path, rng: np.random.Generator) -> tuple[dict, dict]:
    """onnx.checker, ONNX Runtime against torch graph by graph, then ``generate`` over ONNX Runtime
    against the PyTorch model's, greedy and beam, token for token."""
    import onnx
    import onnxruntime as ort

    for name in ONNX_FILES:
        onnx.checker.check_model(str(folder / name))
    sessions = {
        name: ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"]) for name in ONNX_FILES
    }
    ids, mask = sample(model, rng)
    layers = layers_of(model)
    diffs: dict[str, float] = {}
    limits: dict[str, float] = {}
    with torch.no_grad():
        hidden = Encoder(model).eval()(ids, mask)
        (found,) = sessions[ENCODER_FILE].run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        _difference("encoder last_hidden_state", hidden, found, diffs, limits)
        start = torch.full((len(ids), 1), int(model.config.decoder_start_token_id or 0))
        feed = {"decoder_input_ids": start.numpy(), HIDDEN: hidden.numpy(), "encoder_attention_mask": mask.numpy()}
        first = DecoderInit(model).eval()(start, hidden, mask)
        found = sessions[DECODER_INIT_FILE].run(None, _inputs_of(sessions[DECODER_INIT_FILE], feed))
        _difference("decoder_init logits", first[0], found[0], diffs, limits)
        steps = torch.from_numpy(rng.integers(5, int(model.config.vocab_size), size=(len(ids), PAST_TOKENS)))
        cache = DecoderStep(model).eval()(steps, hidden, mask, *first[1:])  # the past grows by three tokens
        grown = []
        for layer in range(layers):
            own = cache[1 + 2 * layer : 3 + 2 * layer]
            before = first[1 + 4 * layer : 5 + 4 * layer]
            grown += [torch.cat([before[0], own[0]], 2), torch.cat([before[1], own[1]], 2), before[2], before[3]]
        following = torch.from_numpy(rng.integers(5, int(model.config.vocab_size), size=(len(ids), 1)))
        reference = DecoderStep(model).eval()(following, hidden, mask, *grown)
        feed = {**feed, "decoder_input_ids": following.numpy()}
        feed.update({name: tensor.numpy() for name, tensor in zip(cache_names(layers, "past"), grown)})
        found = sessions[DECODER_STEP_FILE].run(None, _inputs_of(sessions[DECODER_STEP_FILE], feed))
        _difference(f"decoder_step logits (past {1 + PAST_TOKENS})", reference[0], found[0], diffs, limits)
    model.eval()
    failed = [f"{n}: {diffs[n]:.3g} > {limits[n]:.3g}" for n in diffs if not diffs[n] <= limits[n]]
    if failed:
        raise ExportError(f"[{spec.name}] ONNX Runtime differs from torch beyond the tolerance: " + "; ".join(failed))
    compare_generate(spec, model, folder, ids, mask)
    return diffs, limits


def _inputs_of(session, feed: dict) -> dict:
    return {i.name: feed[i.name] for i in session.get_inputs()}


def compare_generate(spec: ModelSpec, model: nn.Module, folder: Path, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """``generate`` over the ONNX graphs equals the PyTorch model's, text by text, greedy and beam."""
    from app.triton.onnx_generate import OnnxSeq2SeqLM

    ours = OnnxSeq2SeqLM(spec.text.folder, folder, threads=1)
    for settings in ({"num_beams": 1}, {"num_beams": 2}):
        for row in range(len(ids)):
            text = {
                "input_ids": ids[row : row + 1, mask[row].bool()],
                "attention_mask": mask[row : row + 1, mask[row].bool()],
            }
            with torch.no_grad():
                want = model.generate(**text, max_new_tokens=CHECK_NEW_TOKENS, do_sample=False, **settings)
                got = ours.generate(**text, max_new_tokens=CHECK_NEW_TOKENS, do_sample=False, **settings)
            if want.tolist() != got.tolist():
                raise ExportError(
                    f"[{spec.name}] generate() over ONNX Runtime differs from torch ({settings}): "
                    f"{got.tolist()} against {want.tolist()}"
                )
    model.eval()


def digest(folder: Path) -> str:
    """One sha256 of the three graphs (source.json's ``onnx_sha256``)."""
    found = hashlib.sha256()
    for name in ONNX_FILES:
        found.update(name.encode() + bytes.fromhex(sha256_of(folder / name)))
    return found.hexdigest()


def cached(folder: Path) -> dict | None:
    """A previous export's report where its three graphs are all there."""
    report = folder / REPORT_FILE
    if not report.is_file() or not all((folder / name).is_file() for name in ONNX_FILES):
        return None
    found = json.loads(report.read_text())
    return found if found.get("opset") == OPSET and found.get("onnx_sha256") == digest(folder) else None


def ensure_export(spec: ModelSpec, choice: weights.WeightsChoice, cache: Path, reexport: bool, step) -> dict:
    """The checked graphs of (model, weights) in ``cache`` and their report (from the cache when there)."""
    hit = None if reexport else cached(cache)
    if hit:
        print(f"[{spec.name}] ONNX export ({choice.describe()}) from the cache: {cache}", flush=True)
        return hit
    with step(spec.name, f"loading the model ({choice.describe()})"):
        model = load_model(spec, choice)
    partial = cache / "partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rng = np.random.default_rng(choice.seed)
    with step(spec.name, "exporting the encoder and the decoder's first and later steps to ONNX"):
        export(model, partial, rng)
    with step(spec.name, "checking the export (onnx.checker, ONNX Runtime vs torch, generate greedy and beam)"):
        diffs, limits = check(spec, model, partial, np.random.default_rng(choice.seed + 1))
    for name in ONNX_FILES:
        (partial / name).replace(cache / name)
    partial.rmdir()
    report = {"opset": OPSET, "onnx_sha256": digest(cache), "max_abs_diff": diffs, "tolerance": limits}
    (cache / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def write_version(version: Path, cache: Path, link, graphs: bool = True) -> None:
    """The version folder: the three graphs (not with ``graphs`` False: --config-only) and the
    python-backend model that generates over them."""
    version.mkdir(parents=True, exist_ok=True)
    for stale in ("model.onnx", "model.plan"):
        (version / stale).unlink(missing_ok=True)
    for name in ONNX_FILES if graphs else ():
        link(cache / name, version / name)
    shutil.copyfile(TEXT2TEXT_MODEL, version / "model.py")


class EncoderDecoder:
    """The text2text family's export (``Family.export``): three checked graphs and the python-backend
    model that runs ``generate`` over them (``steps``: ``scripts.model_prep.steps.STEPS``)."""

    def prepare(self, spec, options, steps) -> dict:
        return steps.prepare_generation(spec, options)


ENCODER_DECODER = EncoderDecoder()
