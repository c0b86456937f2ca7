"""An image model's answer drawn on its image: a detector's boxes with their labels and scores (a
zero-shot detector's too, one colour a label), a
classifier's top-k written in a box at the top left, a segmenter's masks (mask_generation) laid
translucent over the photo, one colour a prompt (its best mask). ``python -m scripts.caller invoke
--draw out.png`` uses it.

The image is shown as the model saw it (EXIF orientation applied), so a detection's box, given in
that image's pixels, falls where the answer says: its outline's outer edge is the box's
coordinates, rounded.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from clients import rle

# Distinct, readable colours (Tableau 10), one a class id.
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)
TEXT, BACKGROUND = (255, 255, 255), (0, 0, 0)
MASK_OPACITY = 0.5  # a mask's colour over the photo's pixels


class NotDrawable(ValueError):
    """The answer is not an image model's (a fill-mask answer, an error)."""


def displayed(data: bytes) -> Image.Image:
    """The image as the model saw it: EXIF orientation applied, RGB."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow before 10.1: a fixed bitmap font
        return ImageFont.load_default()


def line_width(image: Image.Image) -> int:
    return max(2, round(max(image.size) / 320))


def draw_detections(image: Image.Image, detections: Sequence[Mapping[str, Any]]) -> Image.Image:
    """Each box outlined in its class's colour (outer edge at the box), its label and score above it."""
    canvas = ImageDraw.Draw(image)
    width, font = line_width(image), _font(max(12, round(max(image.size) / 50)))
    for found in sorted(detections, key=lambda d: d["score"]):  # the best drawn last, on top
        x1, y1, x2, y2 = (round(v) for v in found["box"])
        colour = PALETTE[int(found.get("class_id", 0)) % len(PALETTE)]
        canvas.rectangle((x1, y1, x2, y2), outline=colour, width=width)
        caption = f"{found.get('label', found.get('class_id'))} {found['score']:.2f}"
        left, top, right, bottom = canvas.textbbox((0, 0), caption, font=font)
        y = y1 - (bottom - top) - 6 if y1 - (bottom - top) - 6 >= 0 else y1 + width
        canvas.rectangle((x1, y, x1 + right - left + 6, y + bottom - top + 6), fill=colour)
        canvas.text((x1 + 3 - left, y + 3 - top), caption, fill=TEXT, font=font)
    return image


def labelled(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A zero-shot detector's boxes, each label given a colour (a class id) in the order labels first appear."""
    ids: dict[str, int] = {}
    return [{**one, "class_id": ids.setdefault(str(one["label"]), len(ids))} for one in found]


def draw_classes(image: Image.Image, classes: Sequence[Mapping[str, Any]]) -> Image.Image:
    """The top-k, one line each (label and score), on a dark box at the top left."""
    canvas = ImageDraw.Draw(image)
    font = _font(max(12, round(max(image.size) / 40)))
    lines = [f"{c['label']}  {c['score']:.3f}" for c in classes]
    boxes = [canvas.textbbox((0, 0), line, font=font) for line in lines]
    height = max(b[3] - b[1] for b in boxes) + 4
    canvas.rectangle((0, 0, max(b[2] - b[0] for b in boxes) + 12, height * len(lines) + 8), fill=BACKGROUND)
    for number, (line, box) in enumerate(zip(lines, boxes)):
        canvas.text((6 - box[0], 4 + number * height - box[1]), line, fill=TEXT, font=font)
    return image


def _best(entry: Any) -> Any:
    return entry[0] if isinstance(entry, list) and entry else entry


def is_masks(result: Any) -> bool:
    """A mask_generation answer: one entry a prompt, a mask (or, with multimask_output, a list of them)."""
    return (
        isinstance(result, list)
        and bool(result)
        and all(isinstance(_best(e), Mapping) and "mask" in _best(e) for e in result)
    )


def lay_masks(image: Image.Image, answers: Sequence[Mapping[str, Any]]) -> Image.Image:
    """Each answer's mask translucent over the image, answer i in the palette's colour i."""
    pixels = np.asarray(image, dtype=np.float32).copy()
    for number, answer in enumerate(answers):
        mask = rle.decode(answer["mask"]).astype(bool)
        if mask.shape != pixels.shape[:2]:
            raise NotDrawable(
                f"mask {number + 1} is {mask.shape[1]}x{mask.shape[0]}, the image {image.width}x{image.height}"
            )
        colour = np.asarray(PALETTE[number % len(PALETTE)], dtype=np.float32)
        pixels[mask] = (1 - MASK_OPACITY) * pixels[mask] + MASK_OPACITY * colour
    return Image.fromarray(pixels.round().astype(np.uint8))


def draw_segmented(image: Image.Image, found: Sequence[Mapping[str, Any]]) -> Image.Image:
    """A grounded_segmentation answer: each detection's mask translucent, then its box, label and
    score, one colour a detection."""
    return draw_detections(lay_masks(image, found), [{**one, "class_id": i} for i, one in enumerate(found)])


def draw_masks(image: Image.Image, prompts: Sequence[Any]) -> Image.Image:
    """Each prompt's mask (its best, with multimask_output) translucent in its own colour, the prompt's
    number at its box's top left."""
    answers = [_best(entry) for entry in prompts]
    drawn = lay_masks(image, answers)
    canvas = ImageDraw.Draw(drawn)
    font = _font(max(12, round(max(image.size) / 50)))
    for number, answer in enumerate(answers):
        x, y = answer["box"][:2]
        caption = f"{number + 1} {answer['score']:.2f}"
        left, top, right, bottom = canvas.textbbox((0, 0), caption, font=font)
        canvas.rectangle((x, y, x + right - left + 6, y + bottom - top + 6), fill=PALETTE[number % len(PALETTE)])
        canvas.text((x + 3 - left, y + 3 - top), caption, fill=TEXT, font=font)
    return drawn


def draw_answer(data: bytes, result: Any) -> Image.Image:
    """The image with the answer drawn on it; ``NotDrawable`` when it is not an image model's answer."""
    image = displayed(data)
    if isinstance(result, Mapping) and isinstance(result.get("detections"), list):
        return draw_detections(image, result["detections"])
    if (
        isinstance(result, list)
        and result
        and all(isinstance(c, Mapping) and {"box", "label", "mask"} <= set(c) for c in result)
    ):
        return draw_segmented(image, result)
    if (
        isinstance(result, list)
        and result
        and all(isinstance(c, Mapping) and {"box", "label"} <= set(c) for c in result)
    ):
        return draw_detections(image, labelled(result))
    if isinstance(result, list) and result and all(isinstance(c, Mapping) and "label" in c for c in result):
        return draw_classes(image, result)
    if is_masks(result):
        return draw_masks(image, result)
    raise NotDrawable("the answer has neither detections, classes nor masks to draw")


JPEG_QUALITY = 85  # a drawn answer as .jpg: small enough for a page, the labels still sharp


def save(image: Image.Image, path: Path) -> Path:
    """The drawing in the format its name says (``out.jpg``: JPEG; PNG for any name Pillow does not
    know, ``out.png`` among them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = Image.registered_extensions().get(path.suffix.lower(), "PNG")
    image.save(path, format=kind, **({"quality": JPEG_QUALITY} if kind == "JPEG" else {}))
    return path
