"""The text families' export: a Hugging Face folder (``[export] transformers``) to a checked ONNX graph.

No well-kept exporter fits the pinned transformers (``optimum-onnx`` needs transformers < 4.58), so
the graph is ``torch.onnx.export(dynamo=False)`` of a small wrapper with dynamic batch and sequence
axes, checked as the other exports are (``onnx.checker``, tensors against the spec, ONNX Runtime
against torch with the max difference printed). Each family names its ``Head`` (``Family.export``):

- ``text_classification``: ``AutoModelForSequenceClassification`` -> ``logits [batch, labels]``;
- ``token_classification``: ``AutoModelForTokenClassification``, then the pipeline's softmax over the
  labels inside the graph -> ``scores [batch, tokens, labels]``;
- ``sentence_embedding``: ``AutoModel``, then sentence-transformers' pooling inside the graph ->
  ``embeddings [batch, dim]`` (a folder's ``Normalize`` module runs in the router);
- ``fill_mask``: ``AutoModelForMaskedLM``, then softmax and top-k inside the graph (``SoftmaxTopK``)
  -> ``scores`` and ``token_ids [batch, tokens, K]``, checked by their probabilities (``topk_compare``:
  near-equal candidates may swap places between torch and ONNX Runtime).

Weights: the folder's own when it has them (``--weights random``/``small``: seeded random weights of
its ``config.json`` instead); a folder without weights gets random ones, said loudly. A hub id is
fetched into ``<model>/hub/`` first; with no network that stops with one line naming the id.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core.spec import SPEC_FILE, ModelSpec
from app.core.text_spec import HUB_FOLDER, ROUTER_FILES, SOURCE_KEY, unfetched_hub_id
from scripts.model_prep import weights
from scripts.model_prep.recipes import Recipe, RecipeError, SoftmaxTopK, Tolerance, generic_compare, topk_compare

HUB_URL = "https://huggingface.co"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Logits and embeddings: float32 kernels of torch and ONNX Runtime sum in different orders.
TEXT_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
# The wrappers' revision, part of the export cache's key: a graph exported by older wrappers is not reused.
GRAPH_REVISION = 2  # 2: a sentence embedding's graph ends at the pooling (Normalize runs in the router)
SAMPLE_TOKENS = 24  # the longest row of the export's check (rows are padded to it, later rows shorter)


def fetch_hub(model_folder: Path, probe=weights.probe) -> None:
    """A model.toml naming a hub id gets the id's files in ``<model>/hub/`` (config, tokenizer and
    weights), once; with no network, a RecipeError of one line naming the id and asking for a folder."""
    source = unfetched_hub_id(model_folder, SPEC_FILE)
    if source is None:
        return
    reason = probe(HUB_URL)
    if reason is not None:
        raise RecipeError(
            f"[{model_folder.name}] [export] {SOURCE_KEY} = {source!r} is a hub id and the hub cannot be reached "
            f"({reason}); save the model elsewhere with save_pretrained() and put that folder in {model_folder} "
            f'({SOURCE_KEY} = "<its name>")'
        )
    from huggingface_hub import snapshot_download

    print(f"[{model_folder.name}] fetching {source} into {model_folder / HUB_FOLDER}", flush=True)
    snapshot_download(source, local_dir=model_folder / HUB_FOLDER)


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def config_digest(spec: ModelSpec) -> str:
    """What the graph depends on besides the weights: the folder's settings, the spec's tensors and its
    ``[export]`` table (a text_generation model's engine, say)."""
    export = sorted((key, repr(value)) for key, value in spec.export.items())
    digest = hashlib.sha256(repr((spec.family, spec.inputs, spec.outputs, GRAPH_REVISION, export)).encode())
    folder = spec.text.folder
    for name in ("config.json", "modules.json", *(f"{m}/config.json" for m in spec.text.modules)):
        if (folder / name).is_file():
            digest.update(name.encode() + (folder / name).read_bytes())
    return digest.hexdigest()[:12]


def choose_weights(spec: ModelSpec, options) -> weights.WeightsChoice:
    """The folder's weights, unless seeded random ones are asked for; none in the folder: random, loudly."""
    variant = config_digest(spec)
    folder = spec.text.folder
    if options.weights in (weights.RANDOM, weights.SMALL):
        return weights.WeightsChoice(weights.RANDOM, options.seed, variant=variant)
    if has_weights(folder):
        return weights.WeightsChoice(weights.FILE, options.seed, folder, variant=variant)
    reason = f"{folder} has no weights ({' or '.join(WEIGHT_FILES[::2])})"
    weights.warn_fallback(spec.name, reason, options.seed)
    return weights.WeightsChoice(weights.RANDOM, options.seed, reason=reason, variant=variant)


class Pooled(nn.Module):
    """An encoder, then sentence-transformers' pooling of its token embeddings (a folder's Normalize
    module is the router's: ``"normalize": false`` answers the pooled vector)."""

    def __init__(self, encoder: nn.Module, mode: str):
        super().__init__()
        self.encoder, self.mode = encoder, mode

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        tokens = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return pool(tokens, attention_mask, self.mode)


def pool(tokens: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """sentence-transformers' ``Pooling._forward_padded`` for one mode (float32 token embeddings)."""
    hidden = tokens.shape[-1]
    if mode == "cls":
        first = mask.to(torch.int32).argmax(dim=1)
        return torch.gather(tokens, 1, first.view(-1, 1, 1).expand(-1, 1, hidden)).squeeze(1)
    if mode == "max":
        keep = mask.unsqueeze(-1).expand_as(tokens).to(tokens.dtype)
        return tokens.masked_fill(keep == 0, float("-inf")).max(dim=1).values
    if mode in ("mean", "mean_sqrt_len_tokens"):
        weight = mask.unsqueeze(-1).to(tokens.dtype)
        count = torch.clamp(weight.sum(dim=1), min=1e-9)
        total = (tokens * weight).sum(dim=1)
        return total / (count if mode == "mean" else torch.sqrt(count))
    if mode == "weightedmean":
        weight = mask.unsqueeze(-1).to(tokens.dtype)
        positions = torch.arange(1, tokens.shape[1] + 1, dtype=tokens.dtype).view(1, -1, 1)
        positions = positions - mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1).to(tokens.dtype)
        weighted = weight * positions
        return (tokens * weighted).sum(dim=1) / torch.clamp(weighted.sum(dim=1), min=1e-9)
    if mode == "lasttoken":
        length = tokens.shape[1]
        values, indices = mask.to(torch.int32).flip(1).max(1)
        indices = torch.where(values == 0, length - 1, indices)
        gather = (length - indices - 1).view(-1, 1, 1).expand(-1, 1, hidden)
        keep = mask.unsqueeze(-1).expand_as(tokens).to(tokens.dtype)
        return torch.gather(tokens * keep, 1, gather).squeeze(1)
    raise RecipeError(f"pooling mode {mode!r} is not served")


class Logits(nn.Module):
    """A head's logits (classification, masked LM) from the spec's inputs, in their order."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


class Probabilities(nn.Module):
    """A head's logits, then the softmax over their last dimension (the labels)."""

    def __init__(self, logits: nn.Module):
        super().__init__()
        self.logits = logits

    def forward(self, *inputs):
        return torch.softmax(self.logits(*inputs), dim=-1)


@dataclass(frozen=True)
class Head:
    """How a text family's folder becomes its graph: the transformers class that loads it, the wrapper
    that puts the family's own last steps into the graph, and how ONNX Runtime's answers are compared
    with torch's. A family names its head (``Family.export``); model preparation calls ``prepare``."""

    auto_class: str  # transformers' Auto class for the folder
    wrap: Callable[[ModelSpec, nn.Module], nn.Module]
    compare: Callable = generic_compare

    def prepare(self, spec: ModelSpec, options, steps) -> dict:
        """One checked graph, written for the target (``steps``: ``scripts.model_prep.steps.STEPS``)."""
        return steps.prepare(spec, recipe(spec, self), options, choose_weights(spec, options))


SEQUENCE_LOGITS = Head("AutoModelForSequenceClassification", lambda spec, model: Logits(model))
TOKEN_PROBABILITIES = Head("AutoModelForTokenClassification", lambda spec, model: Probabilities(Logits(model)))
# sentence-transformers' pooling; its Normalize module runs in the router (the "normalize" option)
POOLED = Head("AutoModel", lambda spec, model: Pooled(model, spec.text.pooling))
# the candidates per position: the outputs' last dimension
MASKED_TOPK = Head(
    "AutoModelForMaskedLM", lambda spec, model: SoftmaxTopK(Logits(model), spec.outputs[0].dims[-1]), topk_compare
)


def _model_class(head: Head):
    import transformers

    return getattr(transformers, head.auto_class)


def _wrapped(spec: ModelSpec, head: Head, model: nn.Module) -> nn.Module:
    model.eval()
    return head.wrap(spec, model).eval()  # a new module is in training mode: dropout would be on in the export


def _from_config(head: Head) -> Callable[[ModelSpec], nn.Module]:
    def build(spec: ModelSpec) -> nn.Module:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(spec.text.folder), attn_implementation="eager")
        return _wrapped(spec, head, _model_class(head).from_config(config, attn_implementation="eager"))

    return build


def _from_folder(head: Head) -> Callable[[ModelSpec, Path], nn.Module]:
    def load(spec: ModelSpec, path: Path) -> nn.Module:
        try:
            model = _model_class(head).from_pretrained(str(path), attn_implementation="eager")
        except (OSError, ValueError) as error:
            raise RecipeError(f"[{spec.name}] {path}: transformers cannot load it: {error}") from None
        return _wrapped(spec, head, model)

    return load


def _no_download(spec: ModelSpec, downloads: Path) -> nn.Module:
    raise RecipeError(f"[{spec.name}] a text model's weights come from its folder (or are seeded random)")


def sample_inputs(spec: ModelSpec, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Token ids of the vocabulary, the first row SAMPLE_TOKENS long, later rows shorter (padded, mask 0)."""
    import json

    config = json.loads((spec.text.folder / "config.json").read_text())
    vocabulary = int(config.get("vocab_size") or 1000)
    length = min(SAMPLE_TOKENS, spec.text.sequence_length)
    ids = rng.integers(5, vocabulary, size=(batch, length))
    mask = np.ones((batch, length), dtype=np.int64)
    for row in range(1, batch):
        used = max(2, length - row * length // (batch + 1))
        mask[row, used:] = 0
        ids[row, used:] = int(config.get("pad_token_id") or 0)
    arrays = {"input_ids": ids.astype(np.int64), "attention_mask": mask}
    if spec.text.token_type_ids:
        types = np.zeros((batch, length), dtype=np.int64)
        types[:, length // 2 :] = 1
        arrays["token_type_ids"] = types * mask
    return {t.name: arrays[t.name] for t in spec.inputs}


def _no_files(spec: ModelSpec) -> list[Path]:
    return []


def recipe(spec: ModelSpec, head: Head) -> Recipe:
    """The export recipe of a text model through its family's head (its weights: ``choose_weights``)."""
    return Recipe(
        pretrained_url=HUB_URL,
        random=_from_config(head),
        small=_from_config(head),
        pretrained=_no_download,
        from_file=_from_folder(head),
        sample_inputs=sample_inputs,
        tolerance=TEXT_TOLERANCE,
        data_files=_no_files,
        compare=head.compare,
    )


def copy_router_files(spec: ModelSpec, model_folder: Path) -> None:
    """The folder's files the router reads (tokenizer, config, pooling settings; never the weights),
    into the same place under the repository's model folder."""
    source = spec.text.folder
    destination = model_folder / source.relative_to(spec.folder)
    if destination.resolve() == source.resolve():
        return
    names = [*ROUTER_FILES, *(f"{module}/config.json" for module in spec.text.modules)]
    for name in names:
        if (source / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, destination / name)
    for module in spec.text.modules:  # a module folder may hold no file (Normalize): it is still named
        (destination / module).mkdir(parents=True, exist_ok=True)
