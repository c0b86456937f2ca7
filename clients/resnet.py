"""Image classification family (``resnet``): torchvision's ImageNet eval transform, softmax, top-k.

Spec ``[preprocess]``: ``resize`` (short side), ``crop``, and ``mean``/``std`` (after scaling to
0..1, torchvision's ``Normalize``) or ``scale``/``offset`` (on 0..255 values).
``[postprocess]``: ``labels`` (one name a line, in class order), ``topk`` (the default).
Result per image: ``[{"label", "index", "score"}, ...]``, best first, scores softmax probabilities.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from app.errors import InvalidInput
from app.settings import Settings
from clients import images
from clients.base import ModelClient, Option, Triton
from clients.spec import ModelSpec, SpecError

IMAGE_CONTENT_TYPES = frozenset({"image/jpeg", "image/png", "application/octet-stream"})


def read_labels(spec: ModelSpec, count: int) -> list[str]:
    """The spec's labels file, which must name exactly ``count`` classes."""
    relative = spec.postprocess.get("labels")
    if not relative:
        raise SpecError(f"{spec.folder}: [postprocess] labels is missing")
    path = spec.file(str(relative))
    try:
        labels = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise SpecError(f"{path}: labels file not found") from None
    if len(labels) != count:
        raise SpecError(f"{path}: {len(labels)} labels for {count} classes")
    return labels


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - np.max(logits)
    exp = np.exp(shifted)
    return exp / exp.sum()


class ImageClient(ModelClient[Any]):
    """Shared by the image families: the input field, the raw types and the decode step."""

    input_field = "img"
    content_types = IMAGE_CONTENT_TYPES

    def decode(self, item: Any, where: str):
        if not isinstance(item, (str, bytes)):
            raise InvalidInput(f"{where} must be a base64 string (or a list of them)")
        return images.decode_image(item, where, self.settings.max_image_pixels)


class ImageClassificationClient(ImageClient):
    family = "image_classification"
    OPTIONS = (Option("topk", int, 1, 1000, default=3),)

    def __init__(self, spec: ModelSpec, triton: Triton, settings: Settings) -> None:
        pre = spec.preprocess
        side = spec.inputs[0].dims[-1]
        self.crop = int(pre.get("crop", side))
        self.resize = int(pre.get("resize", self.crop))
        if spec.inputs[0].dims[-2:] != (self.crop, self.crop) or self.resize < self.crop:
            raise SpecError(
                f"{spec.folder}: crop {self.crop} / resize {self.resize} do not fit the input {spec.inputs[0].dims}"
            )
        try:
            self.lut = images.normalize_lut(
                mean=pre.get("mean"), std=pre.get("std"), scale=pre.get("scale"), offset=pre.get("offset", 0.0)
            )
        except ValueError as error:
            raise SpecError(f"{spec.folder}: [preprocess] {error}") from None
        self.labels = read_labels(spec, spec.outputs[0].dims[-1])
        super().__init__(spec, triton, settings)

    def option_limits(self) -> Mapping[str, float]:
        return {"topk": len(self.labels)}

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], None]:
        image = images.center_crop(images.resize_short_side(self.decode(item, where), self.resize), self.crop)
        pixels = np.asarray(image, dtype=np.uint8)
        return {self.spec.inputs[0].name: images.to_chw(pixels, self.lut)}, None

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: None, options: Mapping[str, Any]) -> list[dict]:
        probabilities = softmax(outputs[self.output_names[0]].reshape(-1))
        top = np.argsort(-probabilities, kind="stable")[: options["topk"]]
        return [{"label": self.labels[i], "index": int(i), "score": float(probabilities[i])} for i in top]
