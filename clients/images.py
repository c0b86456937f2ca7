"""Image pre- and post-processing as pure functions, each beside its inverse.

- ``decode_image``: base64 or raw bytes -> RGB ``PIL.Image``, as displayed (EXIF orientation
  applied); the pixel limit is checked from the header, before any pixel is decoded. With
  ``draft_size``, a JPEG is decoded at a reduced DCT scale (1/2, 1/4, 1/8: libjpeg's draft mode)
  as long as both sides stay at least that size: far less work, a slightly softer image.
- ``resize_short_side`` / ``center_crop`` / ``normalize_lut``: torchvision's ImageNet eval
  transform (``Resize``, ``CenterCrop``, ``ToTensor``, ``Normalize``) on PIL images.
- ``to_input`` / ``from_input``: pixels -> a model's input tensor (channel order, normalisation,
  layout), and back.
- ``letterbox`` / ``scale_boxes``: ultralytics' letterbox (``auto=False``) and its inverse.
- ``non_max_suppression``: YOLOv5's class-aware NMS on one image's raw output, in numpy.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from app.core.errors import InvalidInput, InvalidItem

# One thread for OpenCV's own calls (resize, borders, tables): the sizing plan counts each router
# worker thread and each python-step instance as one CPU, and OpenCV's pool (a thread per core) spreads
# every call over all cores. On 16 cores with 16 letterboxes at a time, the pool gave 0.41 to 0.49 of
# one thread's images/s; a lone call, 2.3 to 2.7 times one thread's (python -m scripts.bench.opencv_threads).
cv2.setNumThreads(1)

# Our own limit (settings.max_image_pixels) is checked from the header before decoding;
# PIL's bomb check would fire first, with its own limit and message, so it is turned off.
Image.MAX_IMAGE_PIXELS = None

DECODABLE_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP", "TIFF")

EXIF_ORIENTATION = 0x0112
TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # the ones that swap width and height
DRAFT_SCALE, FULL_SIZE = "draft_scale", "full_size"  # image.info keys set by decode_image's draft

LETTERBOX_COLOR = (114, 114, 114)  # ultralytics' padding grey, the default pad_color of the families

# YOLOv5's non_max_suppression constants.
MAX_WH = 7680  # per-class box offset, larger than any input side
MAX_NMS = 30000  # candidates kept for NMS, best first


def _b64decode(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:  # base64 wrapped over lines (the `base64` tool's default) is accepted too
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{where} is not valid base64") from None


def open_image(data: str | bytes, where: str, max_pixels: int) -> tuple[bytes, Image.Image]:
    """The encoded bytes and the image opened lazily (its header read, no pixel decoded), the pixel
    limit checked; errors name ``where``."""
    raw = _b64decode(data, where) if isinstance(data, str) else data
    if not raw:
        raise InvalidInput(f"{where} is empty")
    try:
        image = Image.open(io.BytesIO(raw), formats=DECODABLE_FORMATS)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise InvalidInput(f"{where} is not a decodable image (JPEG or PNG expected)") from None
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidInput(f"{where} is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}")
    return raw, image


def displayed_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image as displayed: EXIF orientations 5-8 swap the sides."""
    width, height = image.size
    try:
        orientation = image.getexif().get(EXIF_ORIENTATION, 1)
    except (OSError, ValueError, SyntaxError):
        orientation = 1
    return (height, width) if orientation in TRANSPOSING_ORIENTATIONS else (width, height)


def decode_image(data: str | bytes, where: str, max_pixels: int, draft_size: int | None = None) -> Image.Image:
    """An RGB image as displayed, from base64 text or raw bytes; errors name ``where``.

    ``draft_size``: a JPEG may be decoded at 1/2, 1/4 or 1/8 scale, the smallest that keeps both
    sides at least ``draft_size`` (so a following downscale to that size is still a downscale);
    other formats, and JPEGs too small to reduce, decode whole."""
    _, image = open_image(data, where, max_pixels)
    width, height = image.size
    try:
        scale = 1
        if draft_size and image.format == "JPEG" and min(width, height) >= 2 * draft_size:
            # a square request: the same under any EXIF rotation
            image.draft("RGB", (draft_size, draft_size))
            scale = image.decoderconfig[0] if image.decoderconfig else 1  # (scale, 0) once drafted
            if image.getexif().get(EXIF_ORIENTATION, 1) in TRANSPOSING_ORIENTATIONS:
                width, height = height, width
        image = ImageOps.exif_transpose(image)
        if image.mode != "RGB":
            image = image.convert("RGB")
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise InvalidInput(f"{where} is not a decodable image (truncated or corrupt data)") from None
    if scale > 1:  # what resize_crop needs to place its box as on the whole image
        image.info[DRAFT_SCALE], image.info[FULL_SIZE] = scale, (width, height)
    return image


def decode_item(encoded: bytes, max_pixels: int) -> np.ndarray:
    """A Triton model's one encoded image (its request's item 0) decoded as ``decode_image`` does, HWC
    uint8 RGB; one that does not decode is ``InvalidItem`` (the router answers it as a 400)."""
    try:
        image = decode_image(encoded, InvalidItem.WHERE, max_pixels)
    except InvalidInput as error:
        raise InvalidItem(0, error.message) from None
    return np.asarray(image, dtype=np.uint8)


def full_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) of the image as displayed, also when ``decode_image`` drafted it smaller."""
    return image.info.get(FULL_SIZE, image.size)


def short_side_size(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision ``Resize(size)``'s output (width, height): the short side to ``size``, the long
    side scaled with it and truncated."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def crop_origin(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision ``CenterCrop(size)``'s (left, top) on an image at least ``size`` on each side."""
    return int(round((width - size) / 2.0)), int(round((height - size) / 2.0))


def resize_short_side(image: Image.Image, size: int) -> Image.Image:
    """torchvision ``Resize(size)`` on a PIL image: short side to ``size``, bilinear."""
    if min(image.size) == size:
        return image
    return image.resize(short_side_size(*image.size, size), Image.BILINEAR)


def resize_crop(image: Image.Image, size: int, crop: int) -> Image.Image:
    """``center_crop(resize_short_side(image, size), crop)`` resizing only the crop's region of the
    source (PIL's ``box``): the same filter and sample positions, about half the work; a few
    pixels differ by one level from rounding the box's coordinates. On a JPEG decoded in draft
    mode (``decode_image``'s ``draft_size``) the sizes and the box are those of the whole image,
    scaled down to the decoded one."""
    scale = image.info.get(DRAFT_SCALE, 1)
    width, height = full_size(image)
    new_w, new_h = short_side_size(width, height, size)
    if new_w < crop or new_h < crop:  # padding needed: the plain path (never drafted: too small)
        return center_crop(resize_short_side(image, size), crop)
    left, top = crop_origin(new_w, new_h, crop)
    scale_x, scale_y = width / new_w, height / new_h
    box = (left * scale_x, top * scale_y, (left + crop) * scale_x, (top + crop) * scale_y)
    return image.resize((crop, crop), Image.BILINEAR, box=tuple(v / scale for v in box))


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """torchvision ``CenterCrop(size)`` on a PIL image at least ``size`` on each side."""
    width, height = image.size
    if width < size or height < size:
        # torchvision pads with zeros, the left/top side getting the smaller half
        left, top = (size - width) // 2 if width < size else 0, (size - height) // 2 if height < size else 0
        padded = Image.new(image.mode, (max(width, size), max(height, size)))
        padded.paste(image, (left, top))
        image, (width, height) = padded, padded.size
    left, top = crop_origin(width, height, size)
    return image.crop((left, top, left + size, top + size))


def normalize_lut(
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    scale: float | Sequence[float] | None = None,
    offset: float | Sequence[float] = 0.0,
) -> np.ndarray:
    """A [3, 256] float32 table: uint8 value -> model input, per channel.

    ``mean``/``std``: torchvision's ``ToTensor`` then ``Normalize`` (``(v / 255 - mean) / std``,
    in float32 as torch computes it). ``scale``/``offset`` (one number, or one per channel):
    ``v * scale + offset``, computed in float64 and rounded once, which equals float32 ``v / 255``
    for ``scale = 1/255``.
    """
    values = np.arange(256)
    if mean is not None and std is not None:
        unit = values.astype(np.float32) / np.float32(255)
        mean32 = np.asarray(mean, dtype=np.float32)[:, None]
        std32 = np.asarray(std, dtype=np.float32)[:, None]
        return ((unit[None, :] - mean32) / std32).astype(np.float32)
    if scale is None:
        raise ValueError("normalisation needs mean and std, or scale (and offset)")
    scales = np.broadcast_to(np.asarray(scale, dtype=np.float64), (3,))[:, None]
    offsets = np.broadcast_to(np.asarray(offset, dtype=np.float64), (3,))[:, None]
    return (values[None, :].astype(np.float64) * scales + offsets).astype(np.float32)


def to_chw(pixels: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """HWC uint8 RGB -> CHW float32 through a per-channel table from ``normalize_lut``."""
    planes = np.ascontiguousarray(pixels.transpose(2, 0, 1))
    out = np.empty(planes.shape, dtype=np.float32)
    for channel in range(3):
        out[channel] = cv2.LUT(planes[channel], lut[channel])  # a table lookup, faster than numpy's take
    return out


def to_input(
    pixels: np.ndarray, lut: np.ndarray | None, channels_first: bool = True, reverse_channels: bool = False
) -> np.ndarray:
    """HWC uint8 RGB -> a model's input for one image: channels reversed (RGB -> BGR) when asked,
    each value through its channel's ``lut`` row (``normalize_lut``, in the model's channel order;
    ``None`` keeps the uint8 values), channels first (CHW) or last (HWC)."""
    if reverse_channels:
        pixels = pixels[..., ::-1]
    if lut is None:
        return np.ascontiguousarray(pixels.transpose(2, 0, 1) if channels_first else pixels)
    chw = to_chw(pixels, lut)
    return chw if channels_first else np.ascontiguousarray(chw.transpose(1, 2, 0))


def from_input(
    tensor: np.ndarray, lut: np.ndarray | None, channels_first: bool = True, reverse_channels: bool = False
) -> np.ndarray:
    """The inverse of ``to_input``: a model input -> HWC uint8 RGB (each value to its nearest table entry)."""
    hwc = tensor.transpose(1, 2, 0) if channels_first else tensor
    if lut is None:
        pixels = hwc.astype(np.uint8)
    else:
        pixels = np.stack(
            [np.abs(hwc[..., c, None] - lut[c]).argmin(axis=-1) for c in range(hwc.shape[-1])], axis=-1
        ).astype(np.uint8)
    return np.ascontiguousarray(pixels[..., ::-1] if reverse_channels else pixels)


def letterbox(
    pixels: np.ndarray, size: int, color: Sequence[int] = LETTERBOX_COLOR
) -> tuple[np.ndarray, float, tuple[float, float]]:
    """ultralytics ``letterbox(im, size, color, auto=False, scaleup=True)``.

    Returns the padded image, the ratio and the (dw, dh) padding of each side before rounding.
    """
    height, width = pixels.shape[:2]
    ratio = min(size / height, size / width)
    new_unpad = int(round(width * ratio)), int(round(height * ratio))
    dw, dh = (size - new_unpad[0]) / 2, (size - new_unpad[1]) / 2
    if (width, height) != new_unpad:
        pixels = cv2.resize(pixels, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    pixels = cv2.copyMakeBorder(
        pixels, top, bottom, left, right, cv2.BORDER_CONSTANT, value=tuple(int(c) for c in color)
    )
    return pixels, ratio, (dw, dh)


def letterbox_geometry(input_shape: tuple[int, int], image_shape: tuple[int, int]) -> tuple[float, float, float]:
    """The gain and the (x, y) padding ``scale_boxes`` undoes, as YOLOv5 computes them from the two
    sizes (height, width): ``gain = min(input / image)``, padding the unrounded half of the rest."""
    gain = min(input_shape[0] / image_shape[0], input_shape[1] / image_shape[1])
    return gain, (input_shape[1] - image_shape[1] * gain) / 2, (input_shape[0] - image_shape[0] * gain) / 2


def scale_boxes(input_shape: tuple[int, int], boxes: np.ndarray, image_shape: tuple[int, int]) -> np.ndarray:
    """YOLOv5's ``scale_boxes`` (``ratio_pad=None``) + ``clip_boxes``: xyxy boxes in the letterboxed
    input (height, width) -> the original image (height, width). Returns a new array."""
    gain, pad_x, pad_y = letterbox_geometry(input_shape, image_shape)
    out = np.array(boxes, dtype=np.float32, copy=True)
    out[..., [0, 2]] -= pad_x
    out[..., [1, 3]] -= pad_y
    out[..., :4] /= gain
    out[..., [0, 2]] = out[..., [0, 2]].clip(0, image_shape[1])
    out[..., [1, 3]] = out[..., [1, 3]].clip(0, image_shape[0])
    return out


def xywh2xyxy(boxes: np.ndarray) -> np.ndarray:
    out = np.empty_like(boxes)
    half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
    out[..., 0] = boxes[..., 0] - half_w
    out[..., 1] = boxes[..., 1] - half_h
    out[..., 2] = boxes[..., 0] + half_w
    out[..., 3] = boxes[..., 1] + half_h
    return out


def greedy_nms(boxes: np.ndarray, iou_threshold: float, max_keep: int) -> np.ndarray:
    """Indices kept by greedy NMS over xyxy ``boxes`` already sorted best first
    (torchvision.ops.nms semantics: suppress IoU > threshold, the IoU in the boxes' type compared
    in float64; an IoU of two empty boxes, 0/0, suppresses nothing), stopping at ``max_keep``."""
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    order = np.arange(boxes.shape[0])
    keep: list[int] = []
    while order.size and len(keep) < max_keep:
        i = order[0]
        keep.append(int(i))
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[~(iou.astype(np.float64) > iou_threshold)]
    return np.asarray(keep, dtype=np.int64)


def non_max_suppression(
    prediction: np.ndarray, conf_threshold: float, iou_threshold: float, max_detections: int
) -> np.ndarray:
    """YOLOv5's ``non_max_suppression`` (class-aware, one label per box) on one image's
    [N, 5 + classes] output. Returns [K, 6] float32 rows ``x1, y1, x2, y2, conf, class``, best first."""
    candidates = prediction[prediction[:, 4] > conf_threshold]
    if not candidates.shape[0]:
        return np.zeros((0, 6), dtype=np.float32)
    scores = candidates[:, 5:] * candidates[:, 4:5]
    classes = scores.argmax(axis=1)
    conf = scores[np.arange(scores.shape[0]), classes]
    selected = conf > conf_threshold
    boxes = xywh2xyxy(candidates[selected, :4])
    conf, classes = conf[selected], classes[selected].astype(np.float32)
    order = np.argsort(-conf, kind="stable")[:MAX_NMS]
    boxes, conf, classes = boxes[order], conf[order], classes[order]
    keep = greedy_nms(boxes + classes[:, None] * MAX_WH, iou_threshold, max_detections)
    return np.concatenate([boxes[keep], conf[keep, None], classes[keep, None]], axis=1).astype(np.float32)
