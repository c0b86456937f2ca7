"""The prompts of a ``mask_generation`` request: parsed, checked against the image, and put in SAM's
token order.

Payload fields (``FIELDS``), in the original image's pixels (as displayed):

- ``boxes``: one box ``[x0, y0, x1, y1]`` or a list of them, within the image, ``x0 <= x1``, ``y0 <= y1``;
- ``points``: one prompt's points ``[[x, y], ...]`` or a list of prompts (``[[[x, y], ...], ...]``);
- ``point_labels``: each prompt's labels (1 foreground, 0 background), shaped as ``points``; all 1
  when absent.

Each box is a prompt and each list of points is a prompt; given both, there are as many of each and
prompt i is box i with points i (``SamProcessor``'s ``input_boxes`` and ``input_points`` together).
Neither is no prompt: the whole image is segmented (``clients.sam_grid``).
At most ``MAX_PROMPTS`` prompts of ``MAX_POINTS`` points. In the custom-attributes header (a raw
image body), whose pairs are split at commas, the same fields are numbers separated by spaces,
prompts by semicolons: ``boxes=10 20 200 300;40 50 90 120``, ``points=100 200 150 250;30 40``
(x y pairs), ``point_labels=1 0;1``.

``tokens``: each prompt as SAM's prompt encoder takes it (``SamProcessor`` and ``SamModel`` together):
its points, then SAM's pad point where it has no box, then its box's two corners.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core import mask_contract as contract
from app.core.errors import InvalidInput

BOXES, POINTS, POINT_LABELS = "boxes", "points", "point_labels"
FIELDS = frozenset({BOXES, POINTS, POINT_LABELS})
PROMPT_SEPARATOR = ";"  # between prompts in the custom-attributes header
NUMBER = {"type": "number"}
SCHEMAS: Mapping[str, Mapping[str, Any]] = {  # one item of each (the OpenAPI document's: one or a list)
    BOXES: {"type": "array", "minItems": 4, "maxItems": 4, "items": NUMBER, "description": "[x0, y0, x1, y1]"},
    POINTS: {
        "type": "array",
        "minItems": 1,
        "maxItems": contract.MAX_POINTS,
        "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": NUMBER},
    },
    POINT_LABELS: {"type": "array", "minItems": 1, "maxItems": contract.MAX_POINTS, "items": {"enum": [0, 1]}},
}


@dataclass(frozen=True)
class Prompt:
    """One prompt: its box (or None) and its points with their labels (possibly none)."""

    box: tuple[float, float, float, float] | None
    points: tuple[tuple[float, float], ...]
    labels: tuple[int, ...]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{where} must be a number, got {value!r}")
    return float(value)


def _depth(value: Any) -> int:
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth


def _listed(value: Any, depth: int, where: str) -> list:
    """One item (lists nested ``depth`` deep) as a list of one; a list of items as it is."""
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"{where} must be a non-empty list")
    return [value] if _depth(value) == depth else value


def _boxes(value: Any, where: str) -> list[tuple[float, float, float, float]]:
    boxes = []
    for index, box in enumerate(_listed(value, 1, where)):
        at = f"{where}[{index}]"
        if not isinstance(box, list) or len(box) != 4:
            raise InvalidInput(f"{at} must be [x0, y0, x1, y1]")
        x0, y0, x1, y1 = (_number(v, at) for v in box)
        if x1 < x0 or y1 < y0:
            raise InvalidInput(f"{at} {box}: x1 < x0 or y1 < y0 (a box is [x0, y0, x1, y1])")
        boxes.append((x0, y0, x1, y1))
    return boxes


def _points(value: Any, where: str) -> list[tuple[tuple[float, float], ...]]:
    prompts = []
    for index, points in enumerate(_listed(value, 2, where)):
        at = f"{where}[{index}]"
        if not isinstance(points, list) or not points or len(points) > contract.MAX_POINTS:
            raise InvalidInput(f"{at} must be a list of 1 to {contract.MAX_POINTS} points [x, y]")
        for point in points:
            if not isinstance(point, list) or len(point) != 2:
                raise InvalidInput(f"{at} must be a list of points [x, y], got {point!r}")
        prompts.append(tuple((_number(p[0], at), _number(p[1], at)) for p in points))
    return prompts


def _labels(value: Any, points: list, where: str) -> list[tuple[int, ...]]:
    if value is None:
        return [(contract.FOREGROUND,) * len(each) for each in points]
    labels = _listed(value, 1, where)
    if len(labels) != len(points) or any(
        not isinstance(each, list) or len(each) != len(p) for each, p in zip(labels, points)
    ):
        raise InvalidInput(f"{where} must have one label a point, shaped as points ({[len(p) for p in points]})")
    for index, each in enumerate(labels):
        if any(label not in (contract.BACKGROUND, contract.FOREGROUND) or isinstance(label, bool) for label in each):
            raise InvalidInput(f"{where}[{index}] labels must be 1 (foreground) or 0 (background), got {each}")
    return [tuple(int(v) for v in each) for each in labels]


def parse(payload: Mapping[str, Any], where: str = "payload", limit: int = contract.MAX_PROMPTS) -> tuple[Prompt, ...]:
    """A payload's prompts (none: the whole image); out of bounds is an InvalidInput naming the field."""
    boxes = _boxes(payload[BOXES], f"{where}.{BOXES}") if payload.get(BOXES) is not None else []
    points = _points(payload[POINTS], f"{where}.{POINTS}") if payload.get(POINTS) is not None else []
    if payload.get(POINT_LABELS) is not None and not points:
        raise InvalidInput(f"{where}.{POINT_LABELS} is given without {where}.{POINTS}")
    labels = _labels(payload.get(POINT_LABELS), points, f"{where}.{POINT_LABELS}")
    if not boxes and not points:
        return ()
    if boxes and points and len(boxes) != len(points):
        raise InvalidInput(
            f"{where}.{BOXES} has {len(boxes)} boxes and {where}.{POINTS} {len(points)} prompts: given both, "
            "prompt i is box i with points i"
        )
    count = max(len(boxes), len(points))
    if count > limit:
        raise InvalidInput(f"{where}: {count} prompts, over the limit of {limit}")
    return tuple(
        Prompt(boxes[i] if boxes else None, points[i] if points else (), labels[i] if points else ())
        for i in range(count)
    )


def split_prompts(text: str) -> list[str]:
    """A header value's prompts: the parts between semicolons (the custom attributes' pairs are
    split at commas), each stripped."""
    return [part.strip() for part in text.split(PROMPT_SEPARATOR)]


def from_header(attributes: Mapping[str, str], where: str) -> dict[str, Any]:
    """The header's text form of the fields -> their JSON form (what ``parse`` reads)."""
    found: dict[str, Any] = {}
    for field, width in ((BOXES, 4), (POINTS, 2), (POINT_LABELS, 1)):
        if field not in attributes:
            continue
        rows = []
        for part in split_prompts(attributes[field]):
            try:
                numbers = [float(v) if field != POINT_LABELS else int(v) for v in part.split()]
            except ValueError:
                raise InvalidInput(f"{where} {field}: numbers separated by spaces expected, got {part!r}") from None
            if not numbers or len(numbers) % width or (field == BOXES and len(numbers) != width):
                raise InvalidInput(f"{where} {field}: {part!r} is not {'4 numbers' if width == 4 else 'x y pairs'}")
            rows.append(numbers if width != 2 else [numbers[i : i + 2] for i in range(0, len(numbers), 2)])
        found[field] = rows
    return found


def check_within(prompts: tuple[Prompt, ...], width: int, height: int, where: str) -> None:
    """Every box and point within the image (``width`` x ``height`` as displayed)."""
    for index, prompt in enumerate(prompts):
        if prompt.box is not None:
            x0, y0, x1, y1 = prompt.box
            if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
                raise InvalidInput(
                    f"{where}.{BOXES}[{index}] {list(prompt.box)} is outside the image ({width}x{height})"
                )
        for x, y in prompt.points:
            if not (0 <= x <= width and 0 <= y <= height):
                raise InvalidInput(f"{where}.{POINTS}[{index}] [{x:g}, {y:g}] is outside the image ({width}x{height})")


def tokens(prompts: tuple[Prompt, ...]) -> tuple[np.ndarray, np.ndarray]:
    """[prompts, slots, 2] float64 coordinates and [prompts, slots] labels in SAM's order (points, the
    pad point where there is no box, the box's corners), ``ABSENT`` past each prompt's last token."""
    rows = []
    for prompt in prompts:
        points, labels = [list(p) for p in prompt.points], list(prompt.labels)
        if prompt.box is None:
            points, labels = [*points, [0.0, 0.0]], [*labels, contract.NOT_A_POINT]
        else:
            x0, y0, x1, y1 = prompt.box
            points += [[x0, y0], [x1, y1]]
            labels += [contract.BOX_TOP_LEFT, contract.BOX_BOTTOM_RIGHT]
        rows.append((points, labels))
    slots = max(len(labels) for _, labels in rows)
    coordinates = np.zeros((len(rows), slots, 2), dtype=np.float64)
    marks = np.full((len(rows), slots), contract.ABSENT, dtype=np.int64)
    for index, (points, labels) in enumerate(rows):
        coordinates[index, : len(points)] = points
        marks[index, : len(labels)] = labels
    return coordinates, marks
