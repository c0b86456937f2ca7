"""What the DALI preprocessing tests share (tests/unit/test_dali_pipeline.py on DALI's CPU operators,
tests/gpu/test_dali_gpu.py on the GPU): the shipped specs and variants of them, the references each
image model's step is held to and their tolerances, a network input back to levels of 255, and
JPEGs tagged with an EXIF orientation."""

from __future__ import annotations

import dataclasses
import io
import struct

import numpy as np
from PIL import Image
from torchvision import transforms

from app.core.settings import PROJECT_ROOT
from app.core.spec import ModelSpec, TensorSpec
from clients import images
from clients.families import load_spec
from tests import yolov5_reference

# Tolerances, as the mean |DALI - reference| per photo in levels of 255 (measured on DALI's CPU
# operators: resnet 0.10-0.18, yolov5 0.0-0.12, single pixels by 1 level; on an H100 with
# ``decoder = "fast"``, nvJPEG without libjpeg's chroma upsampling: 0.35-0.40).
# resnet: DALI resizes only the crop's region with its own antialiased bilinear filter (PIL's
# triangle, rounded differently), torchvision resizes the whole image with PIL then crops.
RESNET_MEAN_LEVELS = 3.0
# yolov5: DALI's linear resize without antialiasing against cv2.INTER_LINEAR's fixed-point one, on
# the same decoded pixels (DALI's CPU decoder and PIL give the same bytes) and the same padding.
YOLOV5_MEAN_LEVELS = 1.0
# The other spec settings (layout, channel order, dtype, letterbox classifier), against the
# router's own client on the exact path: the same two resizes as above.
ROUTER_MEAN_LEVELS = 1.0
MEAN_LEVELS = {"resnet": RESNET_MEAN_LEVELS, "yolov5": YOLOV5_MEAN_LEVELS}

TORCHVISION = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])
PIXEL_LIMIT = 40_000_000
EXIF_ORIENTATION = 0x0112


def model_spec(name: str) -> ModelSpec:
    return load_spec(PROJECT_ROOT / "models" / name)


def variant(
    spec: ModelSpec,
    dtype: str | None = None,
    dims: tuple[int, ...] | None = None,
    family: str | None = None,
    **preprocess,
) -> ModelSpec:
    """The spec with its input's dtype/dims and ``[preprocess]`` keys changed (``None`` removes one)."""
    tensor = spec.inputs[0]
    pre = {k: v for k, v in {**spec.preprocess, **preprocess}.items() if v is not None}
    inputs = (TensorSpec(tensor.name, dtype or tensor.dtype, dims or tensor.dims),)
    return dataclasses.replace(spec, inputs=inputs, preprocess=pre, family=family or spec.family)


def _per_channel(value) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (3,))


def to_levels(spec: ModelSpec, tensor: np.ndarray) -> np.ndarray:
    """The network input back to 0..255 values (CHW or HWC as the input is): the inverse of the
    spec's normalisation, (v / 255 - mean) / std or v * scale + offset, per channel in its order."""
    pre = spec.preprocess
    per, base = np.ones(3), np.zeros(3)  # levels = tensor * per + base
    if spec.inputs[0].dtype != "UINT8":
        if "std" in pre:
            per, base = _per_channel(pre["std"]) * 255, _per_channel(pre["mean"]) * 255
        else:
            scale = _per_channel(pre.get("scale", 1 / 255))
            per, base = 1 / scale, -_per_channel(pre.get("offset", 0.0)) / scale
    shape = (3, 1, 1) if str(pre.get("layout", "NCHW")).upper() == "NCHW" else (1, 1, 3)
    return tensor.astype(np.float64) * per.reshape(shape) + base.reshape(shape)


# --- the references -------------------------------------------------------------------------------


def displayed(data: bytes) -> np.ndarray:
    """HWC uint8 RGB as the router decodes it (EXIF orientation applied)."""
    return np.asarray(images.decode_image(data, "img", PIXEL_LIMIT), dtype=np.uint8)


def torchvision_levels(image: Image.Image) -> np.ndarray:
    """torchvision ``Resize(256)`` + ``CenterCrop(224)``, CHW levels."""
    return np.asarray(TORCHVISION(image.convert("RGB")), dtype=np.float64).transpose(2, 0, 1)


def letterbox_levels(pixels: np.ndarray) -> np.ndarray:
    """ultralytics' letterbox to 640 (``auto=False``, padding 114) of HWC RGB pixels, CHW levels."""
    boxed, _, _ = yolov5_reference.letterbox(pixels.copy(), (640, 640), color=(114, 114, 114), auto=False)
    return boxed.transpose(2, 0, 1).astype(np.float64)


def reference_levels(model: str, data: bytes) -> np.ndarray:
    """What the shipped model's step must give for an encoded photo, CHW levels: resnet,
    torchvision's resize and crop of PIL's decoding; yolov5, the letterbox of the router's pixels."""
    if model == "resnet":
        return torchvision_levels(Image.open(io.BytesIO(data)))
    return letterbox_levels(displayed(data))


def mean_levels(spec: ModelSpec, tensor: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(mean, max) of |tensor - reference| in levels of 255."""
    diff = np.abs(to_levels(spec, tensor) - reference)
    return float(diff.mean()), float(diff.max())


# --- EXIF orientation -----------------------------------------------------------------------------


def _segments(jpeg: bytes):
    """(start, end) of each marker segment after SOI, the last one from SOS to the end."""
    i = 2
    while i < len(jpeg):
        if jpeg[i + 1] == 0xDA:
            yield i, len(jpeg)
            return
        (length,) = struct.unpack(">H", jpeg[i + 2 : i + 4])
        yield i, i + 2 + length
        i += 2 + length


def with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The same JPEG (the same compressed data) whose only Exif segment says ``orientation``."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    payload = exif.tobytes()  # b"Exif\0\0" + TIFF
    assert payload.startswith(b"Exif\x00\x00")
    app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    kept = [jpeg[s:e] for s, e in _segments(jpeg) if jpeg[s + 1] != 0xE1 or jpeg[s + 4 : s + 10] != b"Exif\x00\x00"]
    return jpeg[:2] + app1 + b"".join(kept)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
