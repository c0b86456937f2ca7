"""Image classification family (``resnet``, and any classifier configured the same way).

Spec ``[preprocess]``: the input tensor's settings (``clients.vision``: layout, channel order,
normalisation), and how the image is fitted to the input's size:

- ``resize`` (short side) then a centre crop to the input's size: torchvision's ``Resize`` +
  ``CenterCrop`` (the default, ``resize`` defaulting to the input's size);
- or ``letterbox = true``: fitted whole, padded with ``pad_color`` (default 114, 114, 114).

``fast_path = true`` (resize and crop only) trades torchvision's exact pixels for about a third of
the router's work on a photo: a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that
keeps both sides at least ``resize`` (libjpeg's draft mode), and only the crop's region is resized.
The image comes out slightly softer; the resnet fidelity test holds it to a mean difference of
3 levels in 255 per photo and the same top-5 as torchvision's tensor. ``false`` (the default)
gives torchvision's pixels exactly.

``[postprocess]``: ``labels`` (one name a line, in class order), ``topk`` (the default).
Result per image: ``[{"label", "index", "score"}, ...]``, best first, scores softmax probabilities.

The model's outputs are either one tensor of class scores (logits, softmax applied here; or
probabilities with ``softmax = false``), or two: ``[K]`` probabilities best first and their ``[K]``
class indices (softmax and top-k inside the graph, as resnet's export does: K floats and ints come
back instead of every class's score). ``topk`` is then at most K.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from app.core.family import Family
from app.core.pipeline import ROUTER, TRITON
from app.core.spec import SpecError
from clients import images
from clients.options import Option
from clients.vision import (
    IMAGE_CONTENT_TYPES,
    Displayed,
    ImageClient,
    pad_color,
    read_labels,
    setting_flag,
    setting_int,
)

__all__ = ["IMAGE_CONTENT_TYPES", "ImageClassificationClient", "ImageClient", "read_labels", "softmax"]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - np.max(logits)
    exp = np.exp(shifted)
    return exp / exp.sum()


class ImageClassificationClient(ImageClient):
    family = "image_classification"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "image_classification, for one image: the topk classes, best first; score a softmax "
        "probability (the raw score where model.toml's [postprocess] softmax is false).",
        "items": {
            "type": "object",
            "required": ["label", "index", "score"],
            "additionalProperties": False,
            "properties": {"label": {"type": "string"}, "index": {"type": "integer"}, "score": {"type": "number"}},
        },
    }
    OPTIONS = (Option("topk", int, 1, 1000, default=3),)
    PREPROCESS_KEYS = ImageClient.INPUT_KEYS | {"resize", "crop", "letterbox", "pad_color", "fast_path"}
    POSTPROCESS_KEYS = frozenset({"labels", "softmax"})

    def configure(self) -> None:
        spec = self.spec
        self.ranked = len(spec.outputs) == 2  # (probabilities, class indices) best first, from the graph
        if len(spec.outputs) > 2 or (self.ranked and spec.outputs[0].dims != spec.outputs[1].dims):
            raise SpecError(
                f"{spec.folder}: a classifier has one output (class scores) or two of one shape "
                "(top-k probabilities and their class indices)"
            )
        # one label a class: the graph's K ranked classes are the best K of at least as many
        self.labels = read_labels(spec, spec.outputs[0].dims[-1], exact=not self.ranked)
        super().configure()
        pre, where = spec.preprocess, f"{spec.folder}/model.toml: [preprocess]"
        self.letterbox = setting_flag(pre, "letterbox", where)
        if self.height != self.width:
            raise SpecError(
                f"{spec.folder}/model.toml: inputs[0].dims {list(spec.inputs[0].dims)}: the image is "
                f"{self.height}x{self.width}; this family takes square inputs"
            )
        if self.letterbox:
            if "resize" in pre or "crop" in pre:
                raise SpecError(f"{where} letterbox fits the whole image: resize and crop do not apply")
            self.size = self.width
            self.pad_color = pad_color(pre, where)
        else:
            if "pad_color" in pre:
                raise SpecError(f"{where} pad_color applies to letterbox only")
            self.crop = setting_int(pre, "crop", self.width, where)
            self.resize = setting_int(pre, "resize", self.crop, where)
            if self.crop != self.width or self.resize < self.crop:
                raise SpecError(
                    f"{where} crop {self.crop} / resize {self.resize} do not fit the input {list(spec.inputs[0].dims)}"
                )
        self.fast_path = setting_flag(pre, "fast_path", where)
        if self.fast_path and self.letterbox:
            raise SpecError(f"{where} fast_path applies to resize and crop, not letterbox")
        if self.fast_path:
            self.draft_size = self.resize
        self.apply_softmax = bool(spec.postprocess.get("softmax", True))
        if self.ranked and "softmax" in spec.postprocess:
            raise SpecError(f"{spec.folder}/model.toml: [postprocess] softmax: the graph ranks the classes itself")

    def option_limits(self) -> Mapping[str, float]:
        return {"topk": self.spec.outputs[0].dims[-1]}  # the classes, or the K the graph ranks

    def fit(self, image) -> np.ndarray:
        """The decoded image fitted to the input's size, as HWC uint8 RGB."""
        if self.letterbox:
            pixels, _, _ = images.letterbox(np.asarray(image, dtype=np.uint8), self.size, self.pad_color)
            return pixels
        if self.fast_path:
            return np.asarray(images.resize_crop(image, self.resize, self.crop), dtype=np.uint8)
        return np.asarray(images.center_crop(images.resize_short_side(image, self.resize), self.crop), dtype=np.uint8)

    def postprocess(
        self, outputs: Mapping[str, np.ndarray], context: Displayed, options: Mapping[str, Any]
    ) -> list[dict]:
        scores = outputs[self.output_names[0]].reshape(-1)
        if self.ranked:
            indices = outputs[self.output_names[1]].reshape(-1)[: options["topk"]]
            if indices.size and not 0 <= int(indices.max()) < len(self.labels):
                raise RuntimeError(
                    f"{self.name}: class index {int(indices.max())} outside the {len(self.labels)} labels"
                )
            return [{"label": self.labels[i], "index": int(i), "score": float(p)} for i, p in zip(indices, scores)]
        probabilities = softmax(scores) if self.apply_softmax else scores.astype(np.float64)
        top = np.argsort(-probabilities, kind="stable")[: options["topk"]]
        return [{"label": self.labels[i], "index": int(i), "score": float(probabilities[i])} for i in top]


FAMILY = Family(
    name=ImageClassificationClient.family,
    client=ImageClassificationClient,
    pipelines=(TRITON, ROUTER),
    dali=True,
)
