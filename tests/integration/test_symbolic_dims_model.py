"""A detector added by configuration whose ONNX file declares its output dims symbolic ([-1, -1, -1],
as many detector exports do) is prepared with ``python -m scripts.model_prep`` (checked by ONNX Runtime
at batch 2, not refused for its declared dims), served by the real stack (Triton, gunicorn, NGINX)
and answers POST /invocations with detections. On the Triton pipeline its graph gets the same
postprocessing as YOLOv5's (NMS and box scaling appended, no code of the user's), and its answer on
a real photo equals YOLOv5's ``non_max_suppression`` + ``scale_boxes`` on the network's raw output."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import requests
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from app.core.pipeline import DETECTIONS, NUM_DETECTIONS
from app.core.settings import Settings
from clients.detection import network_inputs
from clients.families import load_spec, offline_client
from scripts.model_prep import cli as prepare_models
from scripts.model_prep import onnx_export, triton_config
from tests.detections import assert_same_detections, reference_detections
from tests.references import darknet_photos
from tests.support import b64

pytestmark = pytest.mark.integration

NAME = "tinydet"
SIZE = 64
LABELS = ["cat", "kite"]

# Rows of the output, in the 64-pixel input's pixels: cx, cy, w, h, objectness, class scores.
# Row 0's cx moves right by 8 px from a black to a white image (mean pixel 0 -> 1, scale 1/255);
# row 2 overlaps row 0 (same class, lower score: NMS drops it); row 3 is under the threshold.
BASE = np.array(
    [
        [16, 16, 16, 16, 0.9, 0.8, 0.1],
        [48, 40, 12, 20, 0.8, 0.05, 0.7],
        [17, 16, 16, 16, 0.85, 0.8, 0.1],
        [32, 56, 8, 8, 0.1, 0.5, 0.5],
    ],
    np.float32,
)
SHIFT = np.zeros_like(BASE)
SHIFT[[0, 2], 0] = 8

MODEL_TOML = f"""\
# A tiny YOLO-layout detector added by configuration: output [N, 4, 5 + 2], declared symbolic in its ONNX file.
family = "detection"
description = "tiny detector with symbolic output dims"
max_batch_size = 4
pipeline = "{{pipeline}}"

[[inputs]]
name = "images"
dtype = "FP32"
dims = [3, {SIZE}, {SIZE}]

[[outputs]]
name = "output"
dtype = "FP32"
dims = [{len(BASE)}, {5 + len(LABELS)}]

[batching]
max_queue_delay_microseconds = 1000

[instances]
count = 1

[export]
onnx = "model.onnx"

[preprocess]
size = {SIZE}
pad_color = [114, 114, 114]
scale = 0.00392156862745098  # 1/255
offset = 0.0

[postprocess]
labels = "labels.txt"
conf_threshold = 0.25
iou_threshold = 0.45
max_detections = 300
"""


def tiny_detector(path: Path) -> None:
    """images [batch, 3, height, width] -> output [-1, -1, -1] (really [N, 4, 7]): BASE + mean * SHIFT,
    the rows reshaped with a shape computed from the tensor's own (as exporters write it)."""
    initializers = [
        numpy_helper.from_array(BASE[None], "base"),
        numpy_helper.from_array(SHIFT[None], "shift"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1, BASE.shape[1]], np.int64), "rest"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], axes=[1, 2, 3], keepdims=1),  # [N, 1, 1]
        helper.make_node("Mul", ["mean", "shift"], ["moved"]),
        helper.make_node("Add", ["base", "moved"], ["rows"]),  # [N, 4, 7]
        helper.make_node("Shape", ["rows"], ["rows_shape"]),
        helper.make_node("Gather", ["rows_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["rows", "shape"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        NAME,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [-1, -1, -1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def png(value: int, width: int = 128, height: int = 128) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (value, value, value)).save(buffer, format="PNG")
    return buffer.getvalue()


def expected(mean: float, scale: float) -> list[dict]:
    """YOLOv5's NMS on BASE + mean * SHIFT, boxes scaled from the input to a square image (no padding)."""
    rows = BASE + mean * SHIFT
    found = []
    for row in rows[:2]:  # row 2 is suppressed by row 0, row 3 is under the threshold
        cx, cy, w, h, objectness, *classes = (float(v) for v in row)
        class_id = int(np.argmax(classes))
        box = [(cx - w / 2) * scale, (cy - h / 2) * scale, (cx + w / 2) * scale, (cy + h / 2) * scale]
        found.append(
            {"label": LABELS[class_id], "class_id": class_id, "score": objectness * classes[class_id], "box": box}
        )
    return sorted(found, key=lambda d: -d["score"])


def assert_detections(result: dict, mean: float) -> None:
    assert (result["width"], result["height"]) == (128, 128)
    want = expected(mean, 128 / SIZE)
    got = result["detections"]
    assert [(d["label"], d["class_id"]) for d in got] == [(d["label"], d["class_id"]) for d in want], got
    for served, reference in zip(got, want):
        assert served["score"] == pytest.approx(reference["score"], abs=1e-5)
        assert served["box"] == pytest.approx(reference["box"], abs=1e-3)


def build(work: Path, pipeline: str) -> tuple[Path, Path]:
    """models/tinydet (model.toml, labels, the user's ONNX file) prepared into a repository of its own."""
    source = work / "models" / NAME
    source.mkdir(parents=True)
    (source / "model.toml").write_text(MODEL_TOML.format(pipeline=pipeline))
    (source / "labels.txt").write_text("\n".join(LABELS) + "\n")
    tiny_detector(source / "model.onnx")
    repository = work / "repository"
    with pytest.MonkeyPatch.context() as patch:  # the declared copy goes under the test's folder, not build/
        patch.setattr(onnx_export, "_default_cache_dir", lambda: work / "cache")
        argv = [
            "--source",
            str(work / "models"),
            "--models",
            NAME,
            "--repository",
            str(repository),
            "--target",
            "python",
            "--cache-dir",
            str(work / "cache"),
        ]
        assert prepare_models.main(argv) == 0
    return source, repository


@pytest.mark.parametrize("pipeline", ["triton", "router"])
def test_a_detector_with_symbolic_output_dims_is_added_by_configuration_and_answers(tmp_path, new_stack, pipeline):
    source, repository = build(tmp_path, pipeline)

    # the user's file is left as it is; Triton loads a copy with model.toml's dims declared
    user = onnx.load(str(source / "model.onnx")).graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in user] == [-1, -1, -1]
    graph = onnx.load(str(repository / NAME / "1" / "model.onnx")).graph
    config = triton_config.read_config(repository / NAME / "config.pbtxt")
    if pipeline == "router":  # the raw network, served with model.toml's dims declared
        served = graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in served] == ["batch", 4, 7]
        assert [list(t.dims) for t in config.output] == [[4, 7]]
    else:  # the same postprocessing as YOLOv5's appended to the user's graph
        spec = load_spec(source)
        assert [i.name for i in graph.input] == [t.name for t in network_inputs(spec)]
        assert [o.name for o in graph.output] == [DETECTIONS, NUM_DETECTIONS]
        assert [(t.name, list(t.dims)) for t in config.output] == [(DETECTIONS, [-1, 6]), (NUM_DETECTIONS, [1])]
        assert any(node.op_type == "NonMaxSuppression" for node in graph.node)
    record = json.loads((repository / NAME / "source.json").read_text())
    assert record["weights"] == "file" and record["onnx"] == "model.onnx"
    assert record["onnx_sha256"] == onnx_export.sha256_of(repository / NAME / "1" / "model.onnx")

    stack = new_stack(repository)
    print(f"{NAME} ({pipeline} pipeline): stack healthy after {stack.wait_healthy(timeout=120):.1f} s")
    assert stack.ping().json()["models"].get(NAME) == "READY"

    envelope = requests.post(
        f"{stack.url}/invocations",
        timeout=60,
        json={"modelname": NAME, "payload": {"img": [b64(png(0)), b64(png(255))]}},
    )
    assert envelope.status_code == 200, envelope.text
    body = envelope.json()
    assert body["modelname"] == NAME
    black, white = body["result"]
    print(f"black: {black['detections']}\nwhite: {white['detections']}")
    assert_detections(black, mean=0.0)
    assert_detections(white, mean=1.0)

    raw = requests.post(
        f"{stack.url}/invocations",
        data=png(255),
        timeout=60,
        headers={
            "Content-Type": "image/png",
            "X-Amzn-SageMaker-Custom-Attributes": f"modelname={NAME},conf_threshold=0.6",
        },
    )
    assert raw.status_code == 200, raw.text
    assert [d["label"] for d in raw.json()["result"]["detections"]] == ["cat"]  # kite's 0.56 is under 0.6

    # a real photo: the answer equals YOLOv5's NMS + scale_boxes on the user's network's raw output
    photo = darknet_photos()["dog.jpg"]
    answer = requests.post(
        f"{stack.url}/invocations",
        data=photo,
        timeout=60,
        headers={"Content-Type": "image/jpeg", "X-Amzn-SageMaker-Custom-Attributes": f"modelname={NAME}"},
    )
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    client = offline_client(load_spec(source), Settings())
    tensors, displayed = client.preprocess(photo, "img", {})
    session = ort.InferenceSession(str(source / "model.onnx"), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {"images": tensors["images"][None]})
    theirs = reference_detections(output[0], (displayed.height, displayed.width), 0.25, 0.45, 300, size=SIZE)
    assert (result["width"], result["height"]) == (displayed.width, displayed.height)
    assert len(theirs) == 2
    assert_same_detections(result, theirs, f"{NAME} ({pipeline} pipeline) on dog.jpg")
