"""Detection family (``yolov5``): YOLO-layout detectors with the ultralytics pre- and post-processing.

Spec ``[preprocess]``: the input tensor's settings (``clients.vision``; normalisation defaults to
``scale = 1/255``), ``pad_color`` of the letterbox (default 114, 114, 114); the square input's
side comes from the input's dims (``size``, if given, must agree).
``[postprocess]``: ``labels``, ``conf_threshold``, ``iou_threshold``, ``max_detections`` (defaults).
The model's output is [N, 5 + classes]: cx, cy, w, h, objectness, class scores, in input pixels.

On the Triton pipeline the network's graph has the postprocessing appended
(scripts/model_prep/detector_graph.py): the network model takes the image's tensor, its displayed
size, the letterbox's geometry and the request's options (``network_inputs``) and answers the
detections (``DETECTION_TENSORS``). A request naming a version of the network sends it those
tensors from the router's own preprocessing; on the router's pipeline the network is the raw one
and ``detect`` runs here. Result per image: ``{"width", "height", "detections": [{"label", "class_id", "score", "box"}]}``,
boxes ``[x1, y1, x2, y2]`` in the pixels of the image as displayed, clipped to it, best first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from app.core.family import Family
from app.core.pipeline import DETECTION_OPTIONS, DETECTIONS, IMAGE_SIZE, LETTERBOX, NUM_DETECTIONS, ROUTER, TRITON
from app.core.spec import ModelSpec, SpecError, TensorSpec
from clients import images
from clients.base import Route
from clients.options import Option
from clients.vision import Displayed, ImageClient, pad_color, read_labels, setting_int

# The request's options as the ensemble's one-element tensors, and what it answers (app.core.pipeline).
OPTION_TENSORS = tuple(TensorSpec(name, dtype, (1,)) for name, dtype in DETECTION_OPTIONS.items())
DETECTION_TENSORS = (TensorSpec(DETECTIONS, "FP32", (-1, 6)), TensorSpec(NUM_DETECTIONS, "INT32", (1,)))
# What the preprocessing gives the network beside its image: the displayed size (height, width) and
# the letterbox's gain and x, y padding, as YOLOv5's scale_boxes takes them.
GEOMETRY_TENSORS = (TensorSpec(IMAGE_SIZE, "INT64", (2,)), TensorSpec(LETTERBOX, "FP32", (3,)))


def network_inputs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    """The inputs of a detector's network with its postprocessing in the graph."""
    return (*spec.inputs, *GEOMETRY_TENSORS, *OPTION_TENSORS)


def geometry(size: int, displayed: tuple[int, int]) -> dict[str, np.ndarray]:
    """``GEOMETRY_TENSORS`` of one image (no batch axis), displayed as ``(height, width)``."""
    return {
        IMAGE_SIZE: np.array(displayed, dtype=np.int64),
        LETTERBOX: np.array(images.letterbox_geometry((size, size), displayed), dtype=np.float32),
    }


def option_arrays(options: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The request's options as ``OPTION_TENSORS`` of one item (no batch axis)."""
    return {tensor.name: np.array([options[tensor.name]], dtype=tensor.numpy_dtype) for tensor in OPTION_TENSORS}


def detect(output: np.ndarray, size: int, displayed: tuple[int, int], options: Mapping[str, Any]) -> np.ndarray:
    """One image's raw [N, 5 + classes] output -> [K, 6] rows ``x1, y1, x2, y2, score, class``,
    best first, boxes in the pixels of the image as displayed (``(height, width)``): YOLOv5's
    ``non_max_suppression`` then ``scale_boxes``. Where the pipeline runs NMS, Triton runs this."""
    found = images.non_max_suppression(
        output, float(options["conf_threshold"]), float(options["iou_threshold"]), int(options["max_detections"])
    )
    found[:, :4] = images.scale_boxes((size, size), found[:, :4], displayed)
    return found


class DetectionClient(ImageClient):
    family = "detection"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "description": "detection, for one image: its size as displayed (after its EXIF orientation) and its "
        "detections, best first, each box [x1, y1, x2, y2] in the pixels of that image, clipped to it.",
        "required": ["width", "height", "detections"],
        "additionalProperties": False,
        "properties": {
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "detections": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["label", "class_id", "score", "box"],
                    "additionalProperties": False,
                    "properties": {
                        "label": {"type": "string"},
                        "class_id": {"type": "integer"},
                        "score": {"type": "number"},
                        "box": {"type": "array", "minItems": 4, "maxItems": 4, "items": {"type": "number"}},
                    },
                },
            },
        },
    }
    OPTIONS = (
        Option("conf_threshold", float, 0.0, 1.0, default=0.25),
        Option("iou_threshold", float, 0.0, 1.0, default=0.45),
        Option("max_detections", int, 1, 1000, default=300),
    )
    PREPROCESS_KEYS = ImageClient.INPUT_KEYS | {"size", "pad_color"}
    POSTPROCESS_KEYS = frozenset({"labels"})
    DEFAULT_SCALE = 1 / 255
    letterbox = True  # a detector always letterboxes its image to its square input (size)

    def configure(self) -> None:
        spec = self.spec
        self.labels = read_labels(spec, spec.outputs[0].dims[-1] - 5)
        super().configure()
        where = f"{spec.folder}/model.toml: [preprocess]"
        self.size = setting_int(spec.preprocess, "size", self.width, where)
        if (self.height, self.width) != (self.size, self.size):
            raise SpecError(f"{where} size {self.size} does not fit the input dims {list(spec.inputs[0].dims)}")
        self.pad_color = pad_color(spec.preprocess, where)

    def fit(self, image) -> np.ndarray:
        pixels, _, _ = images.letterbox(np.asarray(image, dtype=np.uint8), self.size, self.pad_color)
        return pixels

    def postprocess(
        self, outputs: Mapping[str, np.ndarray], context: Displayed, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        found = detect(outputs[self.output_names[0]], self.size, (context.height, context.width), options)
        return self.answer(found, context)

    def answer(self, found: np.ndarray, context: Displayed) -> dict[str, Any]:
        """The caller's result from [K, 6] rows (``detect``'s)."""
        detections = [
            {
                "label": self.labels[int(cls)],
                "class_id": int(cls),
                "score": float(score),
                "box": [float(v) for v in box],
            }
            for box, score, cls in zip(found[:, :4], found[:, 4], found[:, 5])
        ]
        return {"width": context.width, "height": context.height, "detections": detections}

    # --- the Triton pipeline: NMS and box scaling run in Triton --------------------------------

    def pipeline_inputs(self) -> tuple[TensorSpec, ...]:
        return super().pipeline_inputs() + OPTION_TENSORS

    def pipeline_outputs(self) -> tuple[TensorSpec, ...]:
        return DETECTION_TENSORS

    def pipeline_route(self) -> Route:
        # On the Triton pipeline the network itself answers detections: a request naming a version of
        # it (the router's route) sends it the image tensor, the letterbox's geometry and the options.
        self.routes[ROUTER] = Route(
            self.spec.triton_name,
            network_inputs(self.spec),
            DETECTION_TENSORS,
            self.network_preprocess,
            self.pipeline_postprocess,
        )
        return super().pipeline_route()

    def pipeline_preprocess(
        self, item: Any, where: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], Displayed]:
        arrays, context = super().pipeline_preprocess(item, where, options)
        return {**arrays, **option_arrays(options)}, context

    def network_preprocess(
        self, item: Any, where: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], Displayed]:
        """The network's tensors when its graph post-processes: the router's own image tensor, the
        letterbox's geometry and the options."""
        arrays, context = self.preprocess(item, where, options)
        return {**arrays, **geometry(self.size, (context.height, context.width)), **option_arrays(options)}, context

    def pipeline_postprocess(
        self, outputs: Mapping[str, np.ndarray], context: Displayed, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        count = int(outputs[NUM_DETECTIONS].reshape(-1)[0])
        return self.answer(outputs[DETECTIONS][:count], context)


FAMILY = Family(
    name=DetectionClient.family,
    client=DetectionClient,
    pipelines=(TRITON, ROUTER),
    dali=True,
    graph_postprocess=True,
)
