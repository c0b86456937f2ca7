"""The DALI preprocessing step (scripts/model_prep/dali_pipeline.py) on DALI's CPU operators, against
the references on the 11 sample photos (tests.references.real_photos):

- resnet: torchvision ``Resize(256)`` + ``CenterCrop(224)``; yolov5: ultralytics' letterbox
  (``auto=False``, tests/yolov5_reference.py) and ``IMAGE_SIZE``, the displayed height and width;
- EXIF orientations: a JPEG tagged 2-8 gives the pixels of the image turned as displayed;
- the generated ``dali.py``: compiles, imports DALI only, defines the GPU graph;
- the Triton config, other spec settings against the router's client, and the SpecErrors.

The GPU pipeline (``mixed`` decoding, nvJPEG) is not run here: tests/gpu/test_dali_gpu.py runs it
where there is a GPU (``make gpu-check``). The helpers and tolerances are tests/dali_support.py's.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import io

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from PIL import Image, ImageOps

from app.core.pipeline import IMAGE, IMAGE_LENGTH, IMAGE_SIZE, LETTERBOX, ROUTER, preprocess_model
from app.core.settings import PROJECT_ROOT, Settings
from app.core.spec import ModelSpec, SpecError
from clients import images
from clients.classification import ImageClassificationClient
from clients.detection import DetectionClient
from scripts.model_prep import dali_pipeline
from scripts.model_prep.triton_config import data_type
from tests.dali_support import (
    EXIF_ORIENTATION,
    RESNET_MEAN_LEVELS,
    ROUTER_MEAN_LEVELS,
    YOLOV5_MEAN_LEVELS,
    displayed,
    letterbox_levels,
    mean_levels,
    model_spec,
    png,
    reference_levels,
    to_levels,
    torchvision_levels,
    variant,
    with_orientation,
)
from tests.references import real_photos

PHOTOS = real_photos()
NAMES = sorted(PHOTOS)
EXIF_PHOTO = "dog.jpg"  # 768x576, with an Exif segment of its own (orientation 1) to replace
ROTATED_6 = Image.Transpose.ROTATE_270  # orientation 6: turned 90 degrees clockwise to display

_PIPELINES: dict = {}


def run(spec: ModelSpec, encoded: list[bytes]) -> list[list[np.ndarray]]:
    """``encoded`` through the spec's CPU pipeline (one built a spec and batch size, 2 threads)."""
    key = (repr(spec), len(encoded))
    if key not in _PIPELINES:
        _PIPELINES[key] = dali_pipeline.build_cpu_pipeline(spec, batch_size=len(encoded), num_threads=2)
    return dali_pipeline.run_cpu(_PIPELINES[key], encoded)


@pytest.fixture(scope="module")
def resnet_out() -> list[np.ndarray]:
    (tensors,) = run(model_spec("resnet"), [PHOTOS[n] for n in NAMES])
    return tensors


@pytest.fixture(scope="module")
def yolov5_out() -> tuple[list[np.ndarray], list[np.ndarray]]:
    tensors, sizes, letterboxes = run(model_spec("yolov5"), [PHOTOS[n] for n in NAMES])
    return tensors, sizes, letterboxes


def test_eleven_photos():
    assert len(NAMES) == 11


# --- (a) resnet against torchvision -------------------------------------------------------------


@pytest.mark.parametrize("index, name", list(enumerate(NAMES)))
def test_resnet_equals_torchvision_resize_crop(resnet_out, index, name):
    spec = model_spec("resnet")
    ours = resnet_out[index]
    assert ours.shape == spec.inputs[0].dims and ours.dtype == spec.inputs[0].numpy_dtype
    mean, top = mean_levels(spec, ours, reference_levels("resnet", PHOTOS[name]))
    print(f"\nresnet {name}: mean |DALI - torchvision| {mean:.3f} levels, max {top:.0f}")
    assert mean <= RESNET_MEAN_LEVELS


# --- (b) yolov5 against ultralytics' letterbox ----------------------------------------------------


@pytest.mark.parametrize("index, name", list(enumerate(NAMES)))
def test_yolov5_equals_ultralytics_letterbox(yolov5_out, index, name):
    spec = model_spec("yolov5")
    tensors, sizes, letterboxes = yolov5_out
    ours, size = tensors[index], sizes[index]
    assert ours.shape == spec.inputs[0].dims and ours.dtype == spec.inputs[0].numpy_dtype
    pixels = displayed(PHOTOS[name])  # EXIF applied
    mean, top = mean_levels(spec, ours, letterbox_levels(pixels))
    print(
        f"\nyolov5 {name} {pixels.shape[1]}x{pixels.shape[0]}: IMAGE_SIZE {size.tolist()}, "
        f"mean |DALI - ultralytics| {mean:.3f} levels, max {top:.0f}"
    )
    assert size.dtype == np.int64 and size.tolist() == list(pixels.shape[:2])
    assert mean <= YOLOV5_MEAN_LEVELS
    # the gain and padding YOLOv5's scale_boxes computes from the two sizes, for the graph's box scaling
    gain, pad_x, pad_y = images.letterbox_geometry((640, 640), tuple(pixels.shape[:2]))
    np.testing.assert_allclose(letterboxes[index], [gain, pad_x, pad_y], rtol=1e-6, atol=1e-4)


# --- (c) EXIF orientation -----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["resnet", "yolov5"])
def test_exif_orientation_gives_the_turned_image(model):
    spec = model_spec(model)
    plain = PHOTOS[EXIF_PHOTO]
    tagged = {o: with_orientation(plain, o) for o in range(1, 9)}
    decoded = Image.open(io.BytesIO(plain)).convert("RGB")
    turned = {}
    for orientation, data in tagged.items():
        opened = Image.open(io.BytesIO(data))
        assert opened.getexif().get(EXIF_ORIENTATION) == orientation
        assert np.array_equal(np.asarray(opened.convert("RGB")), np.asarray(decoded)), "the same compressed data"
        turned[orientation] = ImageOps.exif_transpose(opened).convert("RGB")  # as the router displays it
    assert np.array_equal(np.asarray(turned[6]), np.asarray(decoded.transpose(ROTATED_6)))
    outputs = run(spec, [tagged[o] for o in tagged] + [png(turned[o]) for o in tagged])
    for k, orientation in enumerate(tagged):
        ours, reference = outputs[0][k], outputs[0][k + len(tagged)]
        assert np.array_equal(ours, reference), f"orientation {orientation}"
        if spec.family == "detection":
            height, width = turned[orientation].height, turned[orientation].width
            assert outputs[1][k].tolist() == outputs[1][k + len(tagged)].tolist() == [height, width]
            assert (height, width) == ((768, 576) if orientation >= 5 else (576, 768))
    print(f"\n{model}: {EXIF_PHOTO} tagged with EXIF orientations 1-8 equals the turned image, pixel for pixel")


def test_zero_padding_after_the_image_is_cut_off_by_its_length():
    """A batch of the ensemble pads each image's bytes with zeros to the longest one; only the
    image's own bytes are decoded, so a truncated image still fails instead of decoding padding."""
    spec = model_spec("yolov5")
    photos = [PHOTOS["dog.jpg"], PHOTOS["chelsea.png"]]
    plain = run(spec, photos)
    pipeline = dali_pipeline.build_cpu_pipeline(spec, batch_size=len(photos))
    padded = dali_pipeline.run_cpu(pipeline, [data + bytes(4096) for data in photos], [len(d) for d in photos])
    for a, b in zip(plain, padded):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    data = PHOTOS["dog.jpg"]
    pipeline = dali_pipeline.build_cpu_pipeline(spec, batch_size=1)
    with pytest.raises(RuntimeError):
        dali_pipeline.run_cpu(pipeline, [data[: len(data) // 2] + bytes(len(data) // 2)], [len(data) // 2])


# --- (d) the generated dali.py ------------------------------------------------------------------


@pytest.mark.parametrize("model", ["resnet", "yolov5"])
def test_pipeline_file_compiles_and_imports_dali_only(model):
    spec = model_spec(model)
    text = dali_pipeline.pipeline_file(spec)
    code = compile(text, f"{preprocess_model(model)}/1/{dali_pipeline.PIPELINE_FILE}", "exec")
    imported = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative import"
            imported.add(node.module)
    assert imported and all(name == "nvidia.dali" or name.startswith("nvidia.dali.") for name in imported), imported
    assert "autoserialize" in text and f"batch_size={spec.max_batch_size}" in text
    if importlib.util.find_spec("nvidia.dali.plugin.triton") is None:
        return
    # with the triton plugin installed, the file runs: the backend's pipeline is marked, the GPU graph
    # is defined (every operator's arguments checked against DALI's schemas; not built: no GPU), and
    # the file's own copy of the graph gives the same output on the CPU as build_cpu_pipeline
    namespace: dict = {"__name__": "dali_file"}
    exec(code, namespace)  # noqa: S102 - the pipeline file this project writes, run as Triton would
    assert namespace["PARAMS"] == dali_pipeline.preprocess_params(spec)
    assert getattr(namespace["preprocess"], "_is_autoserialize", False)
    gpu = namespace["preprocess"]()
    assert (gpu.max_batch_size, gpu.device_id) == (spec.max_batch_size, 0)

    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def from_file():
        return namespace["preprocess_graph"](namespace["PARAMS"], "cpu")

    pipe = from_file()
    pipe.build()
    file_out = dali_pipeline.run_cpu(pipe, [PHOTOS["dog.jpg"]])
    ours = run(spec, [PHOTOS["dog.jpg"]])
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(file_out, ours))


# --- (e) the Triton config ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["resnet", "yolov5"])
def test_preprocess_config(model):
    spec = model_spec(model)
    config = dali_pipeline.preprocess_config(spec, 16)
    assert (config.name, config.backend, config.max_batch_size) == (preprocess_model(model), "dali", 16)
    assert len(config.input) == 2
    image, length = config.input
    assert (image.name, image.data_type, list(image.dims), image.allow_ragged_batch) == (
        IMAGE,
        data_type("UINT8"),
        [-1],
        True,
    )
    assert (length.name, length.data_type, list(length.dims)) == (IMAGE_LENGTH, data_type("INT64"), [1])
    network = spec.inputs[0]
    expected = [(network.name, data_type(network.dtype), list(network.dims))]
    if spec.family == "detection":
        expected.extend([(IMAGE_SIZE, data_type("INT64"), [2]), (LETTERBOX, data_type("FP32"), [3])])
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == expected
    # and the pipeline gives exactly those outputs
    outputs = run(spec, [PHOTOS["dog.jpg"]])
    assert len(outputs) == len(expected)
    for (name, _, dims), (out,) in zip(expected, outputs):
        dtype = {network.name: network.numpy_dtype, LETTERBOX: np.dtype(np.float32)}.get(name, np.dtype(np.int64))
        assert (list(out.shape), out.dtype) == (dims, dtype), name
    assert 'backend: "dali"' in dali_pipeline.preprocess_config_text(spec, 16)


# --- other spec settings, against the router's client ---------------------------------------------

VARIANTS = {
    "resnet BGR NHWC FP16": ("resnet", {"dims": (224, 224, 3), "dtype": "FP16", "layout": "NHWC", "channels": "BGR"}),
    "resnet UINT8": ("resnet", {"dtype": "UINT8", "mean": None, "std": None}),
    "resnet scale/offset": (
        "resnet",
        {"mean": None, "std": None, "scale": [0.01, 0.02, 0.03], "offset": [-1.0, 0.5, 0.0]},
    ),
    "resnet letterbox BGR": (
        "resnet",
        {
            "letterbox": True,
            "resize": None,
            "crop": None,
            "fast_path": None,
            "pad_color": [10, 120, 250],
            "channels": "BGR",
        },
    ),
    "yolov5 BGR NHWC UINT8": (
        "yolov5",
        {
            "dims": (640, 640, 3),
            "dtype": "UINT8",
            "layout": "NHWC",
            "channels": "BGR",
            "scale": None,
            "offset": None,
            "pad_color": [0, 64, 255],
        },
    ),
}


@pytest.mark.parametrize("label", list(VARIANTS))
def test_spec_variants_equal_the_router(label):
    model, changes = VARIANTS[label]
    exact = {"fast_path": False} if model == "resnet" else {}  # the router's exact path: torchvision's pixels
    spec = variant(model_spec(model), **{**exact, **changes})
    family = ImageClassificationClient if spec.family == "image_classification" else DetectionClient
    client = family(dataclasses.replace(spec, pipeline=ROUTER), None, Settings())
    photos = ["dog.jpg", "camera-grey.png"]
    outputs = run(spec, [PHOTOS[n] for n in photos])
    for k, name in enumerate(photos):
        tensors, displayed = client.preprocess(PHOTOS[name], "img", {})
        router = tensors[spec.inputs[0].name].astype(spec.inputs[0].numpy_dtype)
        ours = outputs[0][k]
        assert ours.shape == router.shape == spec.inputs[0].dims and ours.dtype == router.dtype
        diff = np.abs(to_levels(spec, ours) - to_levels(spec, router))
        print(f"\n{label} {name}: mean |DALI - router| {diff.mean():.3f} levels, max {diff.max():.0f}")
        assert diff.mean() <= ROUTER_MEAN_LEVELS
        if len(outputs) > 1:
            assert outputs[1][k].tolist() == [displayed.height, displayed.width]


def test_small_and_odd_images():
    """Upscaling (short side under 256), an alpha channel, a tall narrow strip, a few pixels."""
    chelsea = Image.open(io.BytesIO(PHOTOS["chelsea.png"])).convert("RGB")
    astronaut = Image.open(io.BytesIO(PHOTOS["astronaut.png"])).convert("RGB")
    cases = {
        "upscaled 200x133": chelsea.resize((200, 133), Image.BILINEAR),
        "RGBA": Image.merge("RGBA", (*astronaut.split(), Image.new("L", astronaut.size, 128))),
        "strip 120x1000": chelsea.resize((120, 1000), Image.BILINEAR),
        "tiny 5x7": chelsea.resize((5, 7), Image.BILINEAR),
    }
    encoded = [png(image) for image in cases.values()]
    (resnet,) = run(model_spec("resnet"), encoded)
    yolo, sizes, _ = run(model_spec("yolov5"), encoded)
    for k, (label, image) in enumerate(cases.items()):
        rgb = image.convert("RGB")
        resnet_diff, _ = mean_levels(model_spec("resnet"), resnet[k], torchvision_levels(rgb))
        yolo_diff, _ = mean_levels(model_spec("yolov5"), yolo[k], letterbox_levels(np.asarray(rgb)))
        print(f"\n{label}: resnet {resnet_diff:.3f}, yolov5 {yolo_diff:.3f} levels")
        assert resnet_diff <= RESNET_MEAN_LEVELS and yolo_diff <= YOLOV5_MEAN_LEVELS
        assert sizes[k].tolist() == [image.height, image.width]


# --- (f) settings the step cannot take ----------------------------------------------------------

BAD_SPECS = [
    ("resnet", {"dims": (3, 224, 200)}, "dims"),
    ("yolov5", {"dims": (3, 640, 320)}, "dims"),
    ("resnet", {"dims": (4, 224, 224)}, "dims"),
    ("resnet", {"dtype": "UINT8"}, "mean"),  # with resnet's mean and std
    ("yolov5", {"dtype": "UINT8"}, "scale"),  # with yolov5's scale and offset
    ("resnet", {"dtype": "INT32"}, "dtype"),
    ("resnet", {"layout": "NHCW"}, "layout"),
    ("resnet", {"channels": "RGBA"}, "channels"),
    ("resnet", {"crop": 200}, "crop"),
    ("resnet", {"resize": 200}, "resize"),
    ("resnet", {"resize": "big"}, "resize"),
    ("resnet", {"mean": [0.5, 0.5]}, "mean"),
    ("resnet", {"std": [0.2, 0.0, 0.2]}, "std"),
    ("resnet", {"std": None}, "std"),
    ("resnet", {"scale": 0.5}, "scale"),
    ("resnet", {"mean": None, "std": None}, "scale"),
    ("resnet", {"pad_color": [1, 2, 3]}, "pad_color"),
    ("resnet", {"letterbox": True, "fast_path": None, "crop": None}, "resize"),
    ("resnet", {"letterbox": "yes"}, "letterbox"),
    ("yolov5", {"size": 320}, "size"),
    ("yolov5", {"pad_color": [114, 114]}, "pad_color"),
    ("yolov5", {"pad_color": [114, 114, 300]}, "pad_color"),
    ("yolov5", {"scale": "x"}, "scale"),
    ("yolov5", {"offset": [0.0, 0.0]}, "offset"),
    ("yolov5", {"scale": 0.0}, "scale"),
    ("resnet", {"family": "fill_mask"}, "family"),
]


@pytest.mark.parametrize(
    "model, changes, key", BAD_SPECS, ids=[f"{m}-{k}-{i}" for i, (m, _, k) in enumerate(BAD_SPECS)]
)
def test_bad_spec_raises_spec_error_naming_the_key(model, changes, key):
    spec = variant(model_spec(model), **changes)
    with pytest.raises(SpecError, match=rf"\b{key}\b") as raised:
        dali_pipeline.preprocess_params(spec)
    assert str(spec.folder) in str(raised.value)
    with pytest.raises(SpecError, match=rf"\b{key}\b"):
        dali_pipeline.preprocess_config(spec, 8)


# --- python -m scripts.bench.preprocessing, a smoke run -------------------------------------------


def test_preprocessing_bench_runs(capsys):
    from scripts.bench.preprocessing import cli as preprocessing

    photo = PROJECT_ROOT / "build" / "samples" / "dog.jpg"  # real_photos() made sure it is there
    assert (
        preprocessing.main(
            [
                "--models",
                "resnet,yolov5",
                "--images",
                str(photo),
                "--threads",
                "1",
                "--batch",
                "2",
                "--rounds",
                "1",
                "--seconds",
                "0.1",
                "--warmup-seconds",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith(("resnet", "yolov5"))}
    assert {
        ("resnet", "router"),
        ("resnet", "router-exact"),
        ("resnet", "dali-cpu"),
        ("yolov5", "router"),
        ("yolov5", "dali-cpu"),
    } <= set(rows)
    assert float(rows[("resnet", "router-exact")][-2]) <= RESNET_MEAN_LEVELS  # mean |dali - router| in levels
    assert float(rows[("yolov5", "router")][-2]) <= YOLOV5_MEAN_LEVELS
    assert "DALI CPU" in out and "x router" in out
