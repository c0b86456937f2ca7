"""What the image families share: decoding, the labels file, and the model's input tensor as its
spec describes it.

Spec ``[preprocess]`` settings read here (every image family):

- ``layout``: ``"NCHW"`` (default) or ``"NHWC"``; the input's dims say the size.
- ``channels``: ``"RGB"`` (default) or ``"BGR"``.
- normalisation, per channel in the model's channel order: ``mean`` and ``std`` (torchvision's
  ``ToTensor`` + ``Normalize``: ``(v / 255 - mean) / std``), or ``scale`` and ``offset``
  (``v * scale + offset`` on 0..255 values). A UINT8 input takes the pixels as they are, with none.
- The input dtype is the ``[[inputs]]`` dtype (FP32, FP16 or UINT8).

On the Triton pipeline (``app.core.pipeline``) the router only opens the image's header (the pixel
limit, the displayed size) and sends the encoded bytes; the pipeline's preprocessing step runs this
same ``preprocess`` inside Triton (``scripts/model_prep/triton_image_steps.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

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


@dataclass(frozen=True)
class Displayed:
    """What postprocessing needs of one image: its size as displayed (EXIF orientation applied)."""

    width: int
    height: int


# What an image model's Triton pipeline takes: the encoded image and its length (app.core.pipeline).
IMAGE_TENSORS = (TensorSpec(IMAGE, "UINT8", (-1,)), TensorSpec(IMAGE_LENGTH, "INT64", (1,)))


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


class ImageClient(ModelClient[Any]):
    """An image model: ``img`` in, decoded with the pixel limit, fed as the spec's input tensor."""

    input_field = "img"
    content_types = IMAGE_CONTENT_TYPES
    INPUT_KEYS: ClassVar[frozenset[str]] = frozenset({"layout", "channels", *NORMALISATION_KEYS})
    DEFAULT_SCALE: ClassVar[float | None] = None  # the family's scale when the spec gives no normalisation
    draft_size: int | None = None  # a family that downscales to a known size sets it (decode_image's draft_size)

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
            raise SpecError(f"{spec.folder}: input {tensor.name} {list(tensor.dims)} is not a 3-channel {self.layout} image")
        self.height, self.width = (tensor.dims[1:] if self.layout == "NCHW" else tensor.dims[:2])
        self.lut = self._lut(spec, where)

    def _lut(self, spec: ModelSpec, where: str) -> np.ndarray | None:
        pre, dtype = spec.preprocess, spec.inputs[0].dtype
        given = [key for key in NORMALISATION_KEYS if key in pre]
        if dtype == "UINT8":
            if given:
                raise SpecError(f"{where} {given[0]}: a UINT8 input takes the pixels as they are, without normalisation")
            return None
        if dtype not in FLOAT_INPUTS:
            raise SpecError(f"{spec.folder}: image input dtype {dtype} is not one of {('UINT8', *FLOAT_INPUTS)}")
        if ("mean" in pre or "std" in pre) and ("scale" in pre or "offset" in pre):
            raise SpecError(f"{where} give mean and std, or scale and offset, not both")
        try:
            return images.normalize_lut(
                mean=pre.get("mean"),
                std=pre.get("std"),
                scale=pre.get("scale", None if "mean" in pre else self.DEFAULT_SCALE),
                offset=pre.get("offset", 0.0),
            )
        except ValueError as error:
            raise SpecError(f"{where} {error}") from None

    def _encoded(self, item: Any, where: str) -> Any:
        if not isinstance(item, (str, bytes)):
            raise InvalidInput(f"{where} must be a base64 string (or a list of them)")
        return item

    def check_item(self, item: Any, where: str) -> None:
        """Base64, a JPEG or PNG header, the pixel limit: no pixel is decoded."""
        images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)

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
        return Route(ensemble_model(self.spec.triton_name), self.pipeline_inputs(), self.pipeline_outputs(),
                     self.pipeline_preprocess, self.pipeline_postprocess)

    def pipeline_preprocess(self, item: Any, where: str, options: Mapping[str, Any]
                            ) -> tuple[dict[str, np.ndarray], Displayed]:
        """The encoded bytes, unread: only the header is opened, for the pixel limit and the size."""
        raw, image = images.open_image(self._encoded(item, where), where, self.settings.max_image_pixels)
        arrays = {IMAGE: np.frombuffer(raw, dtype=np.uint8), IMAGE_LENGTH: np.array([len(raw)], dtype=np.int64)}
        return arrays, Displayed(*images.displayed_size(image))

    def pipeline_postprocess(self, outputs: Mapping[str, np.ndarray], context: Displayed, options: Mapping[str, Any]) -> Any:
        return self.postprocess(outputs, context, options)
