"""What the image families share: decoding, the labels file, and the model's input tensor as its
spec describes it.

Spec ``[preprocess]`` settings read here (every image family):

- ``layout``: ``"NCHW"`` (default) or ``"NHWC"``; the input's dims say the size.
- ``channels``: ``"RGB"`` (default) or ``"BGR"``.
- normalisation, per channel in the model's channel order: ``mean`` and ``std`` (torchvision's
  ``ToTensor`` + ``Normalize``: ``(v / 255 - mean) / std``), or ``scale`` and ``offset``
  (``v * scale + offset`` on 0..255 values). A UINT8 input takes the pixels as they are, with none.
- The input dtype is the ``[[inputs]]`` dtype (FP32, FP16 or UINT8).
- ``decoder``: how the Triton pipeline's DALI step decodes a JPEG on the GPU: ``"exact"`` (default:
  libjpeg's "fancy" chroma upsampling, the router's PIL pixels) or ``"fast"`` (nvJPEG without it:
  30-40% more images/s measured on an H100 with 8 threads, 0.35-0.40 levels of 255 from the references).
  The router, and DALI on the CPU, always decode exactly.

The settings are checked once, at construction (a bad one is a SpecError naming the file and the
key), and kept on the client as plain values (``layout``, ``channels``, ``dtype``, ``height``,
``width``, ``decoder``, ``mean``/``std`` or ``scale``/``offset`` per channel, a family's ``letterbox``,
``size``, ``pad_color``, ``resize``, ``crop``): the pipeline's DALI step
(``scripts/model_prep/dali_pipeline.py``) takes its parameters from them.

On the Triton pipeline (``app.core.pipeline``) the router only opens the image's header (the pixel
limit, the displayed size) and sends the encoded bytes; the pipeline's preprocessing step runs this
same ``preprocess`` inside Triton (``app/triton/image_steps.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from app.core.errors import InvalidInput
from app.core.pipeline import IMAGE, IMAGE_LENGTH, ensemble_model
from app.core.spec import ModelSpec, SpecError, TensorSpec
from clients import images
from clients.base import ModelClient, Route

IMAGE_CONTENT_TYPES = frozenset({"image/jpeg", "image/png", "application/octet-stream"})
LAYOUTS = ("NCHW", "NHWC")
CHANNEL_ORDERS = ("RGB", "BGR")
FLOAT_INPUTS = ("FP32", "FP16")
NORMALISATION_KEYS = ("mean", "std", "scale", "offset")
DECODERS = ("exact", "fast")  # [preprocess] decoder: the DALI step's JPEG decoding on the GPU


@dataclass(frozen=True)
class Displayed:
    """What postprocessing needs of one image: its size as displayed (EXIF orientation applied)."""

    width: int
    height: int


# What an image model's Triton pipeline takes: the encoded image and its length (app.core.pipeline).
IMAGE_TENSORS = (TensorSpec(IMAGE, "UINT8", (-1,)), TensorSpec(IMAGE_LENGTH, "INT64", (1,)))


def setting_int(pre: Mapping[str, Any], key: str, default: int, where: str) -> int:
    """``[preprocess] key``: a positive integer (``default`` when absent)."""
    value = pre.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{where} {key}: a positive integer expected, got {value!r}")
    return value


def setting_flag(pre: Mapping[str, Any], key: str, where: str) -> bool:
    """``[preprocess] key``: true or false (false when absent)."""
    value = pre.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(f"{where} {key} must be true or false, got {value!r}")
    return value


def per_channel(pre: Mapping[str, Any], key: str, default: Any, where: str) -> tuple[float, ...]:
    """``[preprocess] key``: one finite number (for every channel) or three, as three floats."""
    value = pre.get(key, default)
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(items) not in (1, 3) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in items
    ):
        raise SpecError(f"{where} {key}: one number or three expected, got {value!r}")
    return tuple(float(v) for v in items) * (3 if len(items) == 1 else 1)


def pad_color(pre: Mapping[str, Any], where: str) -> tuple[int, int, int]:
    """``[preprocess] pad_color``: the letterbox's padding, three integers 0 to 255 (RGB)."""
    value = pre.get("pad_color", images.LETTERBOX_COLOR)
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(items) != 3 or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in items):
        raise SpecError(f"{where} pad_color: three integers 0 to 255 (red, green, blue) expected, got {value!r}")
    return items[0], items[1], items[2]


def read_labels(spec: ModelSpec, count: int | None, exact: bool = True) -> list[str]:
    """The spec's labels file, which must name exactly ``count`` classes (when given), or at least
    ``count`` when not ``exact`` (a graph that ranks gives the best ``count`` of all its classes)."""
    relative = spec.postprocess.get("labels")
    if not relative:
        raise SpecError(f"{spec.folder}: [postprocess] labels is missing")
    path = spec.file(str(relative))
    try:
        labels = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise SpecError(f"{path}: labels file not found") from None
    if count is not None and (len(labels) != count if exact else len(labels) < count):
        raise SpecError(f"{path}: {len(labels)} labels for {'' if exact else 'at least '}{count} classes")
    return labels


class EncodedImages(ModelClient[Any]):
    """What every image family takes: ``img``, base64 in the JSON envelope or a raw image body, whose
    header is checked (decodable, within the pixel limit) before any work runs."""

    input_field = "img"
    INPUT_SCHEMA: ClassVar[Mapping[str, Any]] = {"type": "string", "format": "byte"}  # base64 JPEG or PNG
    content_types = IMAGE_CONTENT_TYPES

    def _encoded(self, item: Any, where: str) -> Any:
        if not isinstance(item, (str, bytes)):
            raise InvalidInput(f"{where} must be a base64 string (or a list of them)")
        return item

    def check_item(self, item: Any, where: str) -> None:
        """Base64, a JPEG or PNG header, the pixel limit: no pixel is decoded."""
        images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)


class ImageClient(EncodedImages):
    """An image model: ``img`` in, decoded with the pixel limit, fed as the spec's input tensor."""

    INPUT_KEYS: ClassVar[frozenset[str]] = frozenset({"layout", "channels", "decoder", *NORMALISATION_KEYS})
    DEFAULT_SCALE: ClassVar[float | None] = None  # the family's scale when the spec gives no normalisation
    draft_size: int | None = None  # a family that downscales to a known size sets it (decode_image's draft_size)
    # the checked settings (configure), per channel in the model's channel order: mean and std, or
    # scale and offset, the other two None (all four for a UINT8 input)
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    scale: tuple[float, ...] | None
    offset: tuple[float, ...] | None

    def configure(self) -> None:
        super().configure()
        spec = self.spec
        pre, tensor = spec.preprocess, spec.inputs[0]
        where = f"{spec.folder}/model.toml: [preprocess]"
        self.layout = str(pre.get("layout", "NCHW")).upper()
        self.channels = str(pre.get("channels", "RGB")).upper()
        if self.layout not in LAYOUTS or self.channels not in CHANNEL_ORDERS:
            raise SpecError(f"{where} layout must be one of {LAYOUTS} and channels one of {CHANNEL_ORDERS}")
        channel_axis = 0 if self.layout == "NCHW" else 2
        if len(tensor.dims) != 3 or tensor.dims[channel_axis] != 3:
            raise SpecError(
                f"{spec.folder}/model.toml: inputs[0].dims {list(tensor.dims)}: not a 3-channel image "
                f"in layout {self.layout}"
            )
        self.height, self.width = tensor.dims[1:] if self.layout == "NCHW" else tensor.dims[:2]
        self.decoder = pre.get("decoder", DECODERS[0])
        if self.decoder not in DECODERS:
            raise SpecError(f"{where} decoder must be one of {DECODERS}, got {self.decoder!r}")
        self.dtype = tensor.dtype
        self._normalisation(spec, where)
        self.lut = None if self.dtype == "UINT8" else images.normalize_lut(self.mean, self.std, self.scale, self.offset)

    def _normalisation(self, spec: ModelSpec, where: str) -> None:
        """``mean`` and ``std``, or ``scale`` and ``offset`` (per channel, in the model's channel
        order), the others None; all four None for a UINT8 input."""
        pre = spec.preprocess
        self.mean = self.std = self.scale = self.offset = None
        given = [key for key in NORMALISATION_KEYS if key in pre]
        if self.dtype == "UINT8":
            if given:
                raise SpecError(
                    f"{where} {given[0]}: a UINT8 input takes the pixels as they are, without normalisation"
                )
            return
        if self.dtype not in FLOAT_INPUTS:
            raise SpecError(
                f"{spec.folder}/model.toml: inputs[0].dtype {self.dtype}: an image input is one of "
                f"{('UINT8', *FLOAT_INPUTS)}"
            )
        if "mean" in pre or "std" in pre:
            if "scale" in pre or "offset" in pre:
                raise SpecError(
                    f"{where} {'scale' if 'scale' in pre else 'offset'}: give mean and std, or scale "
                    "and offset, not both"
                )
            missing = "std" if "mean" in pre else "mean"
            if missing not in pre:
                raise SpecError(f"{where} {missing}: missing (mean and std go together)")
            self.mean, self.std = per_channel(pre, "mean", None, where), per_channel(pre, "std", None, where)
            if 0 in self.std:
                raise SpecError(f"{where} std: zero")
            return
        if pre.get("scale", self.DEFAULT_SCALE) is None:
            raise SpecError(f"{where} mean, std or scale: normalisation needs mean and std, or scale (and offset)")
        self.scale = per_channel(pre, "scale", self.DEFAULT_SCALE, where)
        self.offset = per_channel(pre, "offset", 0.0, where)
        if 0 in self.scale:
            raise SpecError(f"{where} scale: zero")

    def decode(self, item: Any, where: str):
        return images.decode_image(self._encoded(item, where), where, self.settings.max_image_pixels, self.draft_size)

    def to_tensor(self, pixels: np.ndarray) -> np.ndarray:
        """HWC uint8 RGB of the input's size -> the input tensor of one image (before the dtype cast)."""
        return images.to_input(pixels, self.lut, self.layout == "NCHW", self.channels == "BGR")

    def fit(self, image) -> np.ndarray:
        """The decoded image fitted to the input's size, as HWC uint8 RGB (each family's own)."""
        raise NotImplementedError

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Displayed]:
        image = self.decode(item, where)
        return {self.spec.inputs[0].name: self.to_tensor(self.fit(image))}, Displayed(*images.full_size(image))

    # --- the Triton pipeline -----------------------------------------------------------------

    def pipeline_inputs(self) -> tuple[TensorSpec, ...]:
        """The ensemble's inputs: the encoded image and its length (a batch pads the shorter ones, and
        a truncated image must not decode as if the padding were its data), and a family's options
        as one-element tensors."""
        return IMAGE_TENSORS

    def pipeline_outputs(self) -> tuple[TensorSpec, ...]:
        """The ensemble's outputs: the network's own unless the family post-processes in Triton."""
        return self.spec.outputs

    def pipeline_route(self) -> Route:
        return Route(
            ensemble_model(self.spec.triton_name),
            self.pipeline_inputs(),
            self.pipeline_outputs(),
            self.pipeline_preprocess,
            self.pipeline_postprocess,
        )

    def pipeline_preprocess(
        self, item: Any, where: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], Displayed]:
        """The encoded bytes, unread: only the header is opened, for the pixel limit and the size."""
        raw, image = images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)
        arrays = {IMAGE: np.frombuffer(raw, dtype=np.uint8), IMAGE_LENGTH: np.array([len(raw)], dtype=np.int64)}
        return arrays, Displayed(*images.displayed_size(image))

    def pipeline_postprocess(
        self, outputs: Mapping[str, np.ndarray], context: Displayed, options: Mapping[str, Any]
    ) -> Any:
        return self.postprocess(outputs, context, options)
