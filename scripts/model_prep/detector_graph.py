"""A detector's postprocessing as ONNX, appended to its network's graph.

YOLOv5's ``non_max_suppression`` (``multi_label=False``, ``agnostic=False``) and ``scale_boxes``,
on the network's raw ``[B, N, 5 + classes]`` output (cx, cy, w, h, objectness, class scores), with
the request's options as tensors:

- confidence = objectness x class score, the best class of each box (the first of equal ones);
  a box is a candidate when its objectness and its confidence are both above ``conf_threshold``;
- when N is over YOLOv5's ``max_nms`` (30,000) only the best 30,000 go on (``TopK``);
- boxes offset by class x 7,680 (YOLOv5's ``max_wh``), so that one ``NonMaxSuppression`` per
  image is class-aware, run with that image's own ``iou_threshold``: ONNX's operator takes one
  threshold for all of its batch, so the graph holds one call per slot of the model's
  ``max_batch_size`` (slot b reads image min(b, B - 1); a slot past the batch keeps no box);
- the kept boxes marked in a [B, N] mask, then the best ``max_detections`` of each image, best first
  (``TopK`` over the kept scores, as many rows as the longest answer of the batch);
- ``scale_boxes``: minus the letterbox's padding, divided by its gain, clipped to the displayed
  image; the gain and padding come from the preprocessing as the ``letterbox`` tensor.

Outputs: ``detections`` [B, K, 6] (x1, y1, x2, y2, score, class; rows past an image's count are
zeros) and ``num_detections`` [B, 1]. Every operator is one that ONNX Runtime runs on CPU and that
TensorRT's ONNX parser lists as supported (scripts/model_prep/tensorrt_operators.py; docs/deploying.md,
"TensorRT engines and the GPU type").
The same code serves the built-in YOLOv5 and a detector added by configuration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.core.pipeline import DETECTIONS, IMAGE_SIZE, LETTERBOX, NUM_DETECTIONS, TRITON
from app.core.spec import ModelSpec, TensorSpec
from clients.detection import DETECTION_TENSORS, GEOMETRY_TENSORS, OPTION_TENSORS, DetectionClient, network_inputs
from clients.families import family_of
from clients.images import MAX_NMS, MAX_WH

PREFIX = "postprocess/"  # every node and tensor the postprocessing adds
MIN_OPSET = 13  # Squeeze, Unsqueeze, ReduceSum and Slice take their axes as inputs from opset 13
# NonMaxSuppression keeps at most this many boxes per image: the largest max_detections a request may ask
MAX_KEPT = next(option.maximum for option in DetectionClient.OPTIONS if option.name == "max_detections")


def appends(spec: ModelSpec) -> bool:
    """Whether the network is served with the postprocessing in its graph: a detector on the Triton
    pipeline. On the router's pipeline the router runs NMS on the raw output (``clients.detection``)."""
    return family_of(spec).graph_postprocess and spec.pipeline == TRITON


def served_tensors(spec: ModelSpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of the network model as served (its config.pbtxt)."""
    if appends(spec):
        return network_inputs(spec), DETECTION_TENSORS
    return spec.inputs, spec.outputs


class GraphError(ValueError):
    """A detector's network that the postprocessing cannot be appended to; the message says why."""


class _Builder:
    """Nodes and constants of the postprocessing graph, each named under PREFIX."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list = []
        self.constants: list = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{PREFIX}{hint}_{self.count}"

    def const(self, value, dtype) -> str:
        from onnx import numpy_helper

        name = self.name("const")
        self.constants.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attributes) -> list[str]:
        from onnx import helper

        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attributes))
        return names

    def one(self, op_type: str, *inputs: str, **attributes) -> str:
        return self.op(op_type, list(inputs), **attributes)[0]

    def axes(self, *axes: int) -> str:
        return self.const(list(axes), np.int64)

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        return self.one("Slice", x, self.axes(start), self.axes(end), self.axes(axis))

    def unsqueeze(self, x: str, *axes: int) -> str:
        return self.one("Unsqueeze", x, self.axes(*axes))

    def reduce_max(self, x: str, *axes: int) -> str:
        """ReduceMax without kept dims: axes became an input in opset 18."""
        if self.opset >= 18:
            return self.one("ReduceMax", x, self.axes(*axes), keepdims=0)
        return self.one("ReduceMax", x, axes=list(axes), keepdims=0)


def postprocess_graph(spec: ModelSpec, max_batch_size: int, opset: int, ir_version: int):
    """The postprocessing alone as an ONNX model: the raw output and ``network_inputs``' extra
    tensors in, ``DETECTION_TENSORS`` out (``append`` joins it to the network)."""
    from onnx import TensorProto, helper

    raw = spec.outputs[0]
    boxes_count, width = raw.dims
    if width < 6:
        raise GraphError(f"[{spec.name}] output {raw.name} {list(raw.dims)}: a detector's is [N, 5 + classes]")
    if opset < MIN_OPSET:
        raise GraphError(
            f"[{spec.name}] the network's ONNX opset is {opset}: export it with opset {MIN_OPSET} or later"
        )
    g = _Builder(opset)
    conf, iou, max_det = (t.name for t in OPTION_TENSORS)
    f32, i64 = np.float32, np.int64

    # candidates and their best class
    xywh, objectness = g.slice(raw.name, 0, 4, 2), g.slice(raw.name, 4, 5, 2)  # [B, N, 4], [B, N, 1]
    scores = g.one("Mul", g.slice(raw.name, 5, width, 2), objectness)  # [B, N, C]
    label = g.one("ArgMax", scores, axis=2, keepdims=1)  # [B, N, 1]
    best = g.one("GatherElements", scores, label, axis=2)  # [B, N, 1]
    threshold = g.unsqueeze(conf, 2)  # [B, 1, 1]
    candidate = g.one("And", g.one("Greater", objectness, threshold), g.one("Greater", best, threshold))
    score = g.one("Squeeze", g.one("Where", candidate, best, g.const(-1.0, f32)), g.axes(2))  # [B, N]
    label = g.one("Cast", label, to=TensorProto.FLOAT)  # [B, N, 1]
    centre, half = g.slice(xywh, 0, 2, 2), g.one("Div", g.slice(xywh, 2, 4, 2), g.const(2.0, f32))
    boxes = g.one("Concat", g.one("Sub", centre, half), g.one("Add", centre, half), axis=2)  # [B, N, 4] xyxy
    if boxes_count > MAX_NMS:  # YOLOv5's max_nms: the best candidates only
        score, top = g.op("TopK", [score, g.axes(MAX_NMS)], outputs=2, axis=1)
        top = g.unsqueeze(top, 2)
        boxes = g.one("GatherElements", boxes, g.one("Expand", top, g.axes(1, 1, 4)), axis=1)
        label = g.one("GatherElements", label, top, axis=1)

    # class-aware NMS, one call per batch slot with that image's IoU threshold
    nms_boxes = g.one("Add", boxes, g.one("Mul", label, g.const(float(MAX_WH), f32)))
    batch = g.one("Gather", g.one("Shape", raw.name), g.axes(0))  # [1]
    last = g.one("Sub", batch, g.axes(1))
    ious = g.one("Reshape", iou, g.axes(-1))  # [B]
    selected = []
    for slot in range(max_batch_size):
        index = g.one("Min", g.axes(slot), last)  # [1]: a slot past the batch reads the last image
        keep = g.one("Where", g.one("Less", g.axes(slot), batch), g.axes(MAX_KEPT), g.axes(0))  # and keeps none
        found = g.one(
            "NonMaxSuppression",
            g.one("Gather", nms_boxes, index, axis=0),  # [1, N, 4]
            g.unsqueeze(g.one("Gather", score, index, axis=0), 1),  # [1, 1, N]
            g.one("Reshape", keep, g.const([], i64)),
            g.one("Reshape", g.one("Gather", ious, index, axis=0), g.const([], i64)),
            g.const(0.0, f32),  # candidates only: the others score -1
        )  # [k, 3]: (0, 0, box)
        selected.append(g.one("Add", found, g.const([[slot, 0, 0]], i64)))
    selected = g.one("Concat", *selected, axis=0) if len(selected) > 1 else selected[0]
    pairs = g.one("Gather", selected, g.axes(0, 2), axis=1)  # [k, 2]: (image, box)
    ones = g.one(
        "ConstantOfShape",
        g.one("Gather", g.one("Shape", selected), g.axes(0)),
        value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
    )
    zeros = g.one(
        "ConstantOfShape", g.one("Shape", score), value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    )
    kept = g.one("ScatterND", zeros, pairs, ones)  # [B, N]: 1 where kept
    kept_scores = g.one("Where", g.one("Greater", kept, g.const(0.5, f32)), score, g.const(-1.0, f32))
    count = g.one(
        "Min", g.one("ReduceSum", kept, g.axes(1), keepdims=1), g.one("Cast", max_det, to=TensorProto.FLOAT)
    )  # [B, 1]: kept, at most max_detections
    rows = g.one(
        "Max", g.one("Reshape", g.reduce_max(g.one("Cast", count, to=TensorProto.INT64), 0, 1), g.axes(1)), g.axes(1)
    )
    best_scores, order = g.op("TopK", [kept_scores, rows], outputs=2, axis=1)  # [B, K], best first
    rank = g.one(
        "Cast",
        g.one("Range", g.const(0, i64), g.one("Squeeze", rows, g.axes(0)), g.const(1, i64)),
        to=TensorProto.FLOAT,
    )
    real = g.one("Cast", g.one("Less", g.unsqueeze(rank, 0), count), to=TensorProto.FLOAT)  # [B, K]

    # scale_boxes: padding off, divided by the gain, clipped to the image as displayed
    order = g.unsqueeze(order, 2)
    chosen = g.one("GatherElements", boxes, g.one("Expand", order, g.axes(1, 1, 4)), axis=1)  # [B, K, 4]
    gain = g.unsqueeze(g.slice(LETTERBOX, 0, 1, 1), 2)  # [B, 1, 1]
    pad = g.slice(LETTERBOX, 1, 3, 1)  # [B, 2]: x, y
    pad = g.unsqueeze(g.one("Concat", pad, pad, axis=1), 1)  # [B, 1, 4]
    scaled = g.one("Div", g.one("Sub", chosen, pad), gain)
    size = g.one("Cast", IMAGE_SIZE, to=TensorProto.FLOAT)  # [B, 2]: height, width
    height, width_ = g.slice(size, 0, 1, 1), g.slice(size, 1, 2, 1)
    limits = g.unsqueeze(g.one("Concat", width_, height, width_, height, axis=1), 1)  # [B, 1, 4]
    clipped = g.one("Min", g.one("Max", scaled, g.const(0.0, f32)), limits)
    table = g.one(
        "Concat", clipped, g.unsqueeze(best_scores, 2), g.one("GatherElements", label, order, axis=1), axis=2
    )  # [B, K, 6]
    g.nodes.append(helper.make_node("Mul", [table, g.unsqueeze(real, 2)], [DETECTIONS], name=g.name("Mul")))
    g.nodes.append(helper.make_node("Cast", [count], [NUM_DETECTIONS], name=g.name("Cast"), to=TensorProto.INT32))

    inputs = [
        _value_info(TensorSpec(raw.name, raw.dtype, raw.dims)),
        *(_value_info(t) for t in (*GEOMETRY_TENSORS, *OPTION_TENSORS)),
    ]
    outputs = [_value_info(t) for t in DETECTION_TENSORS]
    graph = helper.make_graph(g.nodes, f"{spec.name}_postprocess", inputs, outputs, g.constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _value_info(tensor: TensorSpec):
    from onnx import helper

    from app.core.spec import TRITON_TO_NUMPY

    dims = ["batch", *(f"{tensor.name}_{i}" if d == -1 else d for i, d in enumerate(tensor.dims))]
    return helper.make_tensor_value_info(
        tensor.name, helper.np_dtype_to_tensor_dtype(np.dtype(TRITON_TO_NUMPY[tensor.dtype])), dims
    )


def network_opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def append(network_path: Path, spec: ModelSpec, max_batch_size: int, destination: Path) -> None:
    """Write the network of ``network_path`` with the postprocessing appended: ``network_inputs`` in,
    ``DETECTION_TENSORS`` out, the raw output an inner tensor."""
    import onnx
    from onnx import compose

    network = onnx.load(str(network_path))
    raw = spec.outputs[0].name
    post = postprocess_graph(spec, max_batch_size, network_opset(network), network.ir_version)
    for opset in network.opset_import:  # the network's other domains, if any, stay as they are
        if opset.domain not in ("", "ai.onnx"):
            post.opset_import.append(opset)
    joined = compose.merge_models(network, post, io_map=[(raw, raw)], outputs=[t.name for t in DETECTION_TENSORS])
    expected = [t.name for t in network_inputs(spec)]
    if [i.name for i in joined.graph.input if i.name not in {x.name for x in joined.graph.initializer}] != expected:
        raise GraphError(f"[{spec.name}] the joined graph's inputs are not {expected}")
    onnx.checker.check_model(joined)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_suffix(".partial")
    onnx.save(joined, str(partial))
    partial.replace(destination)


def raw_network(served_path: Path, spec: ModelSpec, destination: Path) -> None:
    """The network alone (its image in, its raw output out) from a graph with the postprocessing
    appended: what the router's pipeline serves (the benchmark's ``<model>_router`` copy)."""
    import onnx
    from onnx import utils

    model = onnx.load(str(served_path))
    extracted = utils.Extractor(model).extract_model([t.name for t in spec.inputs], [t.name for t in spec.outputs])
    extracted.graph.name = spec.name
    destination.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(extracted, str(destination))
