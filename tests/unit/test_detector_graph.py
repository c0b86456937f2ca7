"""The detector's postprocessing graph (scripts/model_prep/detector_graph.py) in ONNX Runtime against
YOLOv5's ``non_max_suppression`` + ``scale_boxes`` (tests/yolov5_reference.py) on planted outputs
(clusters of overlapping boxes of several classes), every image of one batch at its own options;
past YOLOv5's 30,000 candidates; and the joined graph the tensorrt target builds its engine from,
operator by operator, against TensorRT's ONNX operator list (scripts/model_prep/tensorrt_operators.py,
cited in README)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.core.pipeline import DETECTIONS, NUM_DETECTIONS
from app.core.spec import TensorSpec
from clients.detection import geometry, network_inputs
from clients.families import load_spec
from scripts.model_prep import detector_graph, tensorrt_operators, triton_config
from tests.detections import assert_same_detections, planted_output, reference_detections
from tests.triton_calls import option_tensors

SHAPES = [(576, 768), (768, 576), (480, 640), (1080, 1920), (640, 640), (120, 1000)]
OPTIONS = [
    {"conf_threshold": 0.25, "iou_threshold": 0.45, "max_detections": 300},
    {"conf_threshold": 0.1, "iou_threshold": 0.45, "max_detections": 300},
    {"conf_threshold": 0.5, "iou_threshold": 0.3, "max_detections": 5},
    {"conf_threshold": 0.001, "iou_threshold": 0.6, "max_detections": 300},
    {"conf_threshold": 0.25, "iou_threshold": 0.0, "max_detections": 300},
    {"conf_threshold": 0.3, "iou_threshold": 0.45, "max_detections": 100},
]


@pytest.fixture(scope="module")
def spec(repositories):
    return load_spec(repositories["python"] / "yolov5")


def run_graph(spec, outputs: np.ndarray, shapes, options, max_batch_size: int = 8) -> dict[str, np.ndarray]:
    model = detector_graph.postprocess_graph(spec, max_batch_size, 17, 8)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {
        spec.outputs[0].name: outputs,
        **{
            name: np.stack([geometry(640, shape)[name] for shape in shapes])
            for name in geometry(640, shapes[0])  # the displayed size and the letterbox's gain and padding
        },
        **option_tensors(*options),
    }
    detections, counts = session.run([DETECTIONS, NUM_DETECTIONS], feed)
    return {DETECTIONS: detections, NUM_DETECTIONS: counts}


def as_result(detections: np.ndarray, count: np.ndarray) -> dict:
    found = detections[: int(count[0])]
    return {"detections": [{"box": r[:4].tolist(), "score": float(r[4]), "class_id": int(r[5])} for r in found]}


def test_one_batch_of_planted_outputs_each_at_its_own_options(spec):
    outputs = np.stack([planted_output(seed) for seed in range(len(SHAPES))])
    served = run_graph(spec, outputs, SHAPES, OPTIONS)
    longest = 0
    for row, (shape, options) in enumerate(zip(SHAPES, OPTIONS)):
        theirs = reference_detections(outputs[row], shape, *options.values())
        assert len(set(theirs[:, 5].tolist())) >= 2 or options["max_detections"] < 10, "several classes"
        assert_same_detections(as_result(served[DETECTIONS][row], served[NUM_DETECTIONS][row]), theirs, f"{options}")
        rest = served[DETECTIONS][row][int(served[NUM_DETECTIONS][row][0]) :]
        assert not rest.any(), "rows past an image's count are zeros"
        longest = max(longest, len(theirs))
    assert served[DETECTIONS].shape == (len(SHAPES), longest, 6)  # as many rows as the longest answer


def test_a_smaller_batch_than_the_slots_and_an_image_without_candidates(spec):
    outputs = np.stack([planted_output(7), np.zeros((25200, 85), np.float32)])
    served = run_graph(spec, outputs, SHAPES[:2], OPTIONS[:2])
    theirs = reference_detections(outputs[0], SHAPES[0], *OPTIONS[0].values())
    assert_same_detections(as_result(served[DETECTIONS][0], served[NUM_DETECTIONS][0]), theirs, "first")
    assert served[NUM_DETECTIONS].tolist() == [[len(theirs)], [0]]


def test_more_candidates_than_yolov5s_max_nms(spec):
    """Over 30,000 rows (a larger input's grid): only the best 30,000 candidates go to NMS, as YOLOv5."""
    rows = 40_000
    big = replace(spec, outputs=(TensorSpec(spec.outputs[0].name, "FP32", (rows, 85)),))
    output = planted_output(11, rows=rows)
    output[:, 4] = np.maximum(output[:, 4], 0.26)  # every row a candidate at conf 0.001
    options = {"conf_threshold": 0.001, "iou_threshold": 0.45, "max_detections": 300}
    served = run_graph(big, output[None], [(640, 640)], [options], max_batch_size=1)
    theirs = reference_detections(output, (640, 640), *options.values())
    assert_same_detections(as_result(served[DETECTIONS][0], served[NUM_DETECTIONS][0]), theirs, "40,000 rows")
    # that TopK of 30,000 is past what TensorRT's parser takes: the check below says so
    model = detector_graph.postprocess_graph(big, 1, 17, 8)
    assert any("K 30000 is not under 3840" in p for p in tensorrt_operators.problems(model))


def test_the_tensorrt_targets_graph_has_only_operators_tensorrt_imports(repositories, tmp_path):
    """--target tensorrt --config-only: the network's config takes what the joined graph takes, and
    that graph (what the engine is built from, at the config's batch size) passes the operator list."""
    trt_repository = repositories["tensorrt"]
    spec = load_spec(trt_repository / "yolov5")
    config = triton_config.read_config(trt_repository / "yolov5" / "config.pbtxt")
    assert [t.name for t in config.input] == [t.name for t in network_inputs(spec)]
    assert config.platform == "tensorrt_plan"
    raw, joined = tmp_path / "raw.onnx", tmp_path / "joined.onnx"
    detector_graph.raw_network(repositories["python"] / "yolov5" / "1" / "model.onnx", spec, raw)
    detector_graph.append(raw, spec, config.max_batch_size, joined)
    model = onnx.load(str(joined))
    listed = tensorrt_operators.operators(model)
    print(f"operators of the yolov5 graph with its postprocessing: {', '.join(listed)}")
    assert {"Conv", "NonMaxSuppression", "TopK", "ScatterND"} <= set(listed)
    assert [op for op in listed if op not in tensorrt_operators.TENSORRT_OPERATORS] == []
    assert tensorrt_operators.problems(model) == []
    assert sum(node.op_type == "NonMaxSuppression" for node in model.graph.node) == config.max_batch_size


def test_the_operator_check_can_fail():
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Unique", ["x"], ["y"]),
        helper.make_node("Slice", ["x", "s", "e", "axes"], ["z"]),
        helper.make_node("TopK", ["x", "k"], ["v", "i"], sorted=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    inputs = [x, *(helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("s", "e", "axes", "k"))]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    found = tensorrt_operators.problems(helper.make_model(graph))
    assert any("Unique" in p and "not an operator" in p for p in found)
    assert any("Slice" in p and "not an initializer" in p for p in found)
    assert any("sorted must be 1" in p for p in found)


def test_a_network_the_postprocessing_cannot_join_is_refused_with_its_reason(spec):
    with pytest.raises(detector_graph.GraphError, match="opset is 12: export it with opset 13 or later"):
        detector_graph.postprocess_graph(spec, 8, 12, 8)
    narrow = replace(spec, outputs=(TensorSpec("output", "FP32", (100, 5)),))
    with pytest.raises(detector_graph.GraphError, match=r"\[N, 5 \+ classes\]"):
        detector_graph.postprocess_graph(narrow, 8, 17, 8)
