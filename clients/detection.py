"""Detection family (``yolov5``): YOLO-layout detectors with the ultralytics pre- and post-processing.

Spec ``[preprocess]``: the input tensor's settings (``clients.vision``; normalisation defaults to
``scale = 1/255``), ``pad_color`` of the letterbox (default 114, 114, 114); the square input's
side comes from the input's dims (``size``, if given, must agree).
``[postprocess]``: ``labels``, ``conf_threshold``, ``iou_threshold``, ``max_detections`` (defaults).
The model's output is [N, 5 + classes]: cx, cy, w, h, objectness, class scores, in input pixels.
Result per image: ``{"width", "height", "detections": [{"label", "class_id", "score", "box"}]}``,
boxes ``[x1, y1, x2, y2]`` in the pixels of the image as displayed, clipped to it, best first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from app.core.spec import SpecError
from clients import images
from clients.base import Option
from clients.vision import ImageClient, read_labels


@dataclass(frozen=True)
class Letterboxed:
    """What postprocess needs of one image: its displayed size."""

    width: int
    height: int


class DetectionClient(ImageClient):
    family = "detection"
    OPTIONS = (
        Option("conf_threshold", float, 0.0, 1.0, default=0.25),
        Option("iou_threshold", float, 0.0, 1.0, default=0.45),
        Option("max_detections", int, 1, 1000, default=300),
    )
    PREPROCESS_KEYS = ImageClient.INPUT_KEYS | {"size", "pad_color"}
    POSTPROCESS_KEYS = frozenset({"labels"})
    DEFAULT_SCALE = 1 / 255

    def configure(self) -> None:
        spec = self.spec
        self.labels = read_labels(spec, spec.outputs[0].dims[-1] - 5)
        super().configure()
        self.size = int(spec.preprocess.get("size", self.width))
        if (self.height, self.width) != (self.size, self.size):
            raise SpecError(f"{spec.folder}: size {self.size} does not fit the input {list(spec.inputs[0].dims)}")
        self.pad_color = tuple(int(c) for c in spec.preprocess.get("pad_color", images.LETTERBOX_COLOR))

    def preprocess(
        self, item: Any, where: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], Letterboxed]:
        image = self.decode(item, where)
        pixels, _, _ = images.letterbox(np.asarray(image, dtype=np.uint8), self.size, self.pad_color)
        return {self.spec.inputs[0].name: self.to_tensor(pixels)}, Letterboxed(image.width, image.height)

    def postprocess(
        self, outputs: Mapping[str, np.ndarray], context: Letterboxed, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        found = images.non_max_suppression(
            outputs[self.output_names[0]],
            options["conf_threshold"],
            options["iou_threshold"],
            options["max_detections"],
        )
        boxes = images.scale_boxes((self.size, self.size), found[:, :4], (context.height, context.width))
        detections = [
            {
                "label": self.labels[int(cls)],
                "class_id": int(cls),
                "score": float(score),
                "box": [float(v) for v in box],
            }
            for box, score, cls in zip(boxes, found[:, 4], found[:, 5])
        ]
        return {"width": context.width, "height": context.height, "detections": detections}
