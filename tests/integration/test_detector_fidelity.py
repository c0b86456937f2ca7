"""The detector's pipeline against YOLOv5, on the 11 photos and real forward passes, through a real
Triton over gRPC:

- ``yolov5_preprocess``: its tensor against ultralytics' letterbox, the displayed size, and the
  letterbox's gain and padding against what YOLOv5's ``scale_boxes`` computes from the two sizes;
- the postprocessing appended to the network's graph (``scripts/model_prep/detector_graph.py``),
  served alone by Triton's python target (dynamic batching, ONNX Runtime) and fed the raw output
  of a forward pass with its exact score ties broken (``untie``), against YOLOv5's
  ``non_max_suppression`` + ``scale_boxes`` on the same array: same count, IoU >= 0.999, scores
  within 1e-4, same classes; at the low thresholds random weights need and at a second set
  (a higher ``conf_threshold``, ``iou_threshold`` 0.3, ``max_detections`` 5), requests of both sets
  sent at once so that Triton batches them into shared calls, and both sets in one request;
- the ensemble (``yolov5_pipeline``: preprocess -> the network with its postprocessing) gives what
  the postprocessing gives on the network's own raw output, and its answer is at most 16 KiB an
  image at ``max_detections`` 300.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as mc

from app.core.pipeline import DETECTIONS, IMAGE_SIZE, LETTERBOX, NUM_DETECTIONS
from app.triton import ONNX_MODEL
from clients import images
from clients.detection import DETECTION_TENSORS, GEOMETRY_TENSORS, OPTION_TENSORS
from clients.families import load_spec
from scripts.model_prep import detector_graph, triton_config
from tests import yolov5_reference
from tests.detections import assert_same_detections, reference_detections, untie
from tests.references import real_photos
from tests.triton_calls import encoded_image, grpc_infer, grpc_inputs, option_tensors, served

pytestmark = pytest.mark.integration

PHOTOS = real_photos()
LETTERBOX_MEAN_LEVELS = 1.0
POSTPROCESS = "yolov5_postprocess_graph"  # the appended postprocessing, served alone
# random weights give low scores (at most about 1.7e-4 here): low thresholds leave many candidates
LOW = {"conf_threshold": 1e-4, "iou_threshold": 0.45, "max_detections": 300}
HIGH = {"conf_threshold": 1.5e-4, "iou_threshold": 0.3, "max_detections": 5}
ANSWER_BYTES_PER_IMAGE = 16 * 1024


@pytest.fixture(scope="module")
def forward(repository, triton, tmp_path_factory) -> dict[str, tuple[dict, np.ndarray]]:
    """Per photo: the preprocessing step's outputs, and the raw [25200, 85] output of a forward pass
    of the network (the served graph without its postprocessing, in ONNX Runtime)."""
    spec = load_spec(repository / "yolov5")
    raw = tmp_path_factory.mktemp("raw") / "model.onnx"
    detector_graph.raw_network(repository / "yolov5" / "1" / "model.onnx", spec, raw)
    session = ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"])
    result = {}
    for name, data in PHOTOS.items():
        pre = grpc_infer(triton, "yolov5_preprocess", encoded_image(data), ["images", IMAGE_SIZE, LETTERBOX])
        (output,) = session.run(None, {"images": pre["images"]})
        result[name] = (pre, output[0])
    return result


@pytest.fixture(scope="module")
def postprocess(repository, tmp_path_factory):
    """A Triton serving the postprocessing graph alone (python target: ONNX Runtime in the python
    backend, dynamic batching as the network's config sets it, with a longer queue delay)."""
    spec = load_spec(repository / "yolov5")
    network = triton_config.read_config(repository / "yolov5" / "config.pbtxt")
    root = tmp_path_factory.mktemp("postprocess")
    folder = root / POSTPROCESS / "1"
    folder.mkdir(parents=True)
    shutil.copyfile(ONNX_MODEL, folder / "model.py")
    model = detector_graph.postprocess_graph(spec, network.max_batch_size, 17, 8)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    config = triton_config.parse(triton_config.to_text(network))
    config.name = POSTPROCESS
    # Requests sent at once wait up to 200 ms for each other, so that they share calls even on a
    # machine too busy to send them within the network's own 2 ms.
    config.dynamic_batching.max_queue_delay_microseconds = 200_000
    del config.input[:], config.model_warmup[:]
    for tensor in (spec.outputs[0], *GEOMETRY_TENSORS, *OPTION_TENSORS):
        config.input.add(name=tensor.name, data_type=triton_config.data_type(tensor.dtype), dims=tensor.dims)
    (root / POSTPROCESS / "config.pbtxt").write_text(triton_config.to_text(config))
    with served(root, tmp_path_factory.mktemp("postprocess-runtime"), 120) as client:
        yield client


def settled_statistics(client):
    """The postprocessing's statistics once two reads 50 ms apart agree (Triton counts a call just
    after it answers)."""
    last = client.get_inference_statistics(POSTPROCESS).model_stats[0]
    for _ in range(40):
        time.sleep(0.05)
        now = client.get_inference_statistics(POSTPROCESS).model_stats[0]
        if (now.inference_count, now.execution_count) == (last.inference_count, last.execution_count):
            return now
        last = now
    return last


def request(pre: dict, output: np.ndarray, options: dict) -> dict[str, np.ndarray]:
    return {"output": output[None], IMAGE_SIZE: pre[IMAGE_SIZE], LETTERBOX: pre[LETTERBOX], **option_tensors(options)}


def as_result(detections: np.ndarray, count: np.ndarray) -> dict:
    found = detections[: int(count.reshape(-1)[0])]
    return {"detections": [{"box": r[:4].tolist(), "score": float(r[4]), "class_id": int(r[5])} for r in found]}


def reference(name: str, output: np.ndarray, options: dict) -> np.ndarray:
    height, width = images.full_size(images.decode_image(PHOTOS[name], "img", 40_000_000))[::-1]
    return reference_detections(
        output, (height, width), options["conf_threshold"], options["iou_threshold"], options["max_detections"]
    )


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_the_preprocessing_step_equals_ultralytics_letterbox(forward, name):
    pre, _ = forward[name]
    pixels = np.asarray(images.decode_image(PHOTOS[name], "img", 40_000_000), dtype=np.uint8)
    letterboxed, _, _ = yolov5_reference.letterbox(pixels.copy(), (640, 640), color=(114, 114, 114), auto=False)
    levels = np.abs(pre["images"][0] - letterboxed.transpose(2, 0, 1).astype(np.float32) / 255) * 255
    print(f"{name}: mean |Triton's letterbox - ultralytics| {levels.mean():.3f} levels")
    assert float(levels.mean()) <= LETTERBOX_MEAN_LEVELS
    assert pre[IMAGE_SIZE][0].tolist() == list(pixels.shape[:2])
    # scale_boxes' gain and padding (ratio_pad=None: from the two sizes), in float32
    height, width = pixels.shape[:2]
    gain = min(640 / height, 640 / width)
    expected = np.array([gain, (640 - width * gain) / 2, (640 - height * gain) / 2], dtype=np.float32)
    assert pre[LETTERBOX][0].tolist() == expected.tolist()


@pytest.mark.parametrize("options", [LOW, HIGH], ids=["low", "high"])
@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_the_graphs_postprocessing_equals_yolov5(forward, postprocess, name, options):
    pre, output = forward[name]
    untied = untie(output)
    theirs = reference(name, untied, options)
    served = grpc_infer(postprocess, POSTPROCESS, request(pre, untied, options), [DETECTIONS, NUM_DETECTIONS])
    assert len(theirs) > 0, "the thresholds leave detections"
    assert_same_detections(as_result(served[DETECTIONS][0], served[NUM_DETECTIONS][0]), theirs, f"{name} {options}")


def test_requests_of_both_option_sets_batched_together_each_get_their_own(forward, postprocess):
    """22 requests (each photo at both sets, interleaved) sent at once: Triton's dynamic batcher
    runs several in one call, where every image has its own thresholds; and one request of two
    images, one at each set."""
    before = settled_statistics(postprocess)  # an earlier test's last call counted already
    pending, answers = [], {}
    for name in sorted(PHOTOS):
        pre, output = forward[name]
        for options in (LOW, HIGH):
            key = (name, options["iou_threshold"])
            arrays = request(pre, untie(output), options)

            def done(result, error, key=key):
                answers[key] = error or result

            postprocess.async_infer(POSTPROCESS, grpc_inputs(arrays), done)
            pending.append((key, options))
    for _ in range(600):
        if len(answers) == len(pending):
            break
        time.sleep(0.05)
    after = postprocess.get_inference_statistics(POSTPROCESS).model_stats[0]
    requests = after.inference_count - before.inference_count
    calls = after.execution_count - before.execution_count
    print(f"{requests} requests in {calls} calls of the postprocessing graph")
    assert requests == len(pending) and calls < requests, "Triton batched requests together"
    for (name, _), options in pending:
        result = answers[(name, options["iou_threshold"])]
        assert not isinstance(result, Exception), result
        _, output = forward[name]
        found = as_result(result.as_numpy(DETECTIONS)[0], result.as_numpy(NUM_DETECTIONS)[0])
        assert_same_detections(found, reference(name, untie(output), options), f"{name} batched {options}")

    # both sets in one request of two images
    (first, (pre_a, out_a)), (second, (pre_b, out_b)) = sorted(forward.items())[:2]
    arrays = {
        key: np.concatenate([a, b])
        for (key, a), b in zip(request(pre_a, untie(out_a), LOW).items(), request(pre_b, untie(out_b), HIGH).values())
    }
    served = grpc_infer(postprocess, POSTPROCESS, arrays, [DETECTIONS, NUM_DETECTIONS])
    for row, (name, output, options) in enumerate([(first, out_a, LOW), (second, out_b, HIGH)]):
        found = as_result(served[DETECTIONS][row], served[NUM_DETECTIONS][row])
        assert_same_detections(found, reference(name, untie(output), options), f"{name} in one request {options}")


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_the_ensemble_is_preprocess_then_the_network_with_its_postprocessing(triton, forward, postprocess, name):
    pre, output = forward[name]
    result = triton.infer(
        "yolov5_pipeline",
        grpc_inputs({**encoded_image(PHOTOS[name]), **option_tensors(LOW)}),
        outputs=[grpcclient.InferRequestedOutput(t.name) for t in DETECTION_TENSORS],
    )
    steps = grpc_infer(postprocess, POSTPROCESS, request(pre, output, LOW), [DETECTIONS, NUM_DETECTIONS])
    count = int(result.as_numpy(NUM_DETECTIONS)[0, 0])
    assert count == int(steps[NUM_DETECTIONS][0, 0]) > 0
    np.testing.assert_allclose(result.as_numpy(DETECTIONS)[0][:count], steps[DETECTIONS][0][:count], rtol=0, atol=1e-4)
    # what comes back from the network's step: the detections, a few KB, never the raw output
    answer = sum(len(content) for content in result.get_response().raw_output_contents)
    print(f"{name}: {count} detections, {answer} bytes of outputs (the raw output is {output.nbytes})")
    assert answer <= ANSWER_BYTES_PER_IMAGE


def test_the_answer_is_at_most_16_kib_an_image_at_300_detections(repository):
    """From the ensemble's config: what passes from the network's step on, per image, its dims
    (a -1 being max_detections' 300 rows) times its dtype's size."""
    config = triton_config.read_config(repository / "yolov5_pipeline" / "config.pbtxt")
    network = config.ensemble_scheduling.step[-1]
    assert network.model_name == "yolov5"
    sizes = {"TYPE_FP32": 4, "TYPE_INT32": 4, "TYPE_INT64": 8}
    total = 0
    for tensor in config.output:
        assert tensor.name in network.output_map.values()
        rows = [LOW["max_detections"] if d == -1 else d for d in tensor.dims]
        total += int(np.prod(rows)) * sizes[mc.DataType.Name(tensor.data_type)]
    print(
        f"yolov5: {total} bytes an image from the network's step at max_detections 300 (raw output: {25200 * 85 * 4})"
    )
    assert total <= ANSWER_BYTES_PER_IMAGE
