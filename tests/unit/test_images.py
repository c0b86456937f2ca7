"""clients.images against the references: torchvision's ImageNet eval transform, ultralytics'
letterbox, YOLOv5's scale_boxes and non_max_suppression (yolov5 7.0.14, tests/yolov5_reference.py)."""

from __future__ import annotations

import base64
import io
import struct
import time
import tracemalloc
import zlib

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms

from app.core.errors import InvalidInput
from clients import images
from tests import yolov5_reference
from tests.detections import planted_output

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
LIMIT = 40_000_000


def photo(width: int, height: int, seed: int) -> Image.Image:
    """A photo-like RGB image: smooth gradients, a few shapes and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            127 + 100 * np.sin(x / (7 + seed) + y / 31),
            127 + 100 * np.cos(y / (11 + seed)),
            255 * (x + y) / (width + height),
        ],
        axis=-1,
    )
    base[height // 4 : height // 2, width // 3 : width // 2] = rng.integers(0, 255, 3)
    noisy = base + rng.normal(0, 12, base.shape)
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB")


def encoded(image: Image.Image, fmt: str = "JPEG", **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


SIZES = [(768, 576, 0), (576, 768, 1), (500, 375, 2), (256, 300, 3), (1024, 199, 4), (224, 224, 5), (301, 257, 6)]


@pytest.mark.parametrize("width, height, seed", SIZES)
def test_imagenet_transform_equals_torchvision(width, height, seed):
    data = encoded(photo(width, height, seed))
    reference = transforms.Compose(
        [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    )(Image.open(io.BytesIO(data)).convert("RGB")).numpy()
    image = images.decode_image(base64.b64encode(data).decode(), "payload.img", LIMIT)
    ours = images.to_chw(
        np.asarray(images.center_crop(images.resize_short_side(image, 256), 224)), images.normalize_lut(MEAN, STD)
    )
    assert ours.dtype == np.float32 and ours.shape == (3, 224, 224)
    # the same float32 operations in the same order: equal to the last bit
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("width, height, seed", SIZES)
def test_resize_crop_resizes_only_the_crop_within_one_level(width, height, seed):
    image = photo(width, height, seed)
    whole = np.asarray(images.center_crop(images.resize_short_side(image, 256), 224)).astype(int)
    cropped = np.asarray(images.resize_crop(image, 256, 224)).astype(int)
    assert cropped.shape == whole.shape == (224, 224, 3)
    assert np.abs(cropped - whole).max() <= 1  # the box's coordinates round differently, nothing more
    assert (cropped != whole).mean() < 0.01


@pytest.mark.parametrize(
    "width, height, draft, decoded",
    [
        ((768, 576, 256, (384, 288))),  # 1/2: the short side stays >= 256
        ((2048, 1536, 256, (512, 384))),  # 1/4
        ((4000, 3000, 256, (500, 375))),  # 1/8, the smallest scale libjpeg has
        ((500, 375, 256, (500, 375))),  # under twice the size: decoded whole
        ((768, 576, None, (768, 576))),  # no draft asked
    ],
)
def test_jpeg_draft_decodes_at_the_smallest_scale_that_keeps_the_size(width, height, draft, decoded):
    data = encoded(photo(width, height, 0))
    image = images.decode_image(data, "x", LIMIT, draft)
    assert image.size == decoded and image.mode == "RGB"
    if draft and decoded != (width, height):  # a softer picture of the same scene
        whole = images.decode_image(data, "x", LIMIT).resize(decoded, Image.BILINEAR)
        assert np.abs(np.asarray(image).astype(int) - np.asarray(whole)).mean() < 6


def test_jpeg_draft_keeps_exif_orientation_and_leaves_png_whole():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: displayed as 576 x 768
    rotated = images.decode_image(encoded(photo(768, 576, 1), exif=exif), "x", LIMIT, 256)
    assert rotated.size == (288, 384)
    assert images.decode_image(encoded(photo(768, 576, 1), "PNG"), "x", LIMIT, 256).size == (768, 576)


def test_scale_offset_normalisation_equals_division():
    values = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    ours = images.to_chw(values, images.normalize_lut(scale=1 / 255, offset=0.0))
    np.testing.assert_array_equal(ours, torch.from_numpy(values).permute(2, 0, 1).float().numpy() / 255)


def test_center_crop_pads_small_images_like_torchvision():
    image = photo(100, 150, 7)
    reference = transforms.CenterCrop(160)(image)
    assert np.array_equal(np.asarray(images.center_crop(image, 160)), np.asarray(reference))


def test_decode_applies_exif_orientation_and_converts_modes():
    image = photo(120, 80, 8)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    decoded = images.decode_image(encoded(image, exif=exif), "x", LIMIT)
    assert decoded.size == (80, 120) and decoded.mode == "RGB"
    for mode in ("L", "RGBA", "P", "LA"):
        converted = images.decode_image(encoded(image.convert(mode), "PNG"), "x", LIMIT)
        assert converted.mode == "RGB" and converted.size == (120, 80)
    rgba = image.convert("RGBA")
    assert np.array_equal(np.asarray(images.decode_image(encoded(rgba, "PNG"), "x", LIMIT)), np.asarray(image))


@pytest.mark.parametrize(
    "data, message",
    [
        ("not base64!!", "is not valid base64"),
        (base64.b64encode(b"hello").decode(), "is not a decodable image"),
        (b"", "is empty"),
    ],
)
def test_decode_errors_name_the_item(data, message):
    with pytest.raises(InvalidInput, match=r"payload\.img\[2\] " + message):
        images.decode_image(data, "payload.img[2]", LIMIT)


def test_truncated_image_is_invalid_input():
    data = encoded(photo(300, 200, 9))
    with pytest.raises(InvalidInput, match="not a decodable image"):
        images.decode_image(data[: len(data) // 2], "payload.img", LIMIT)


def test_wrapped_base64_is_accepted():
    data = base64.encodebytes(encoded(photo(50, 40, 1))).decode()
    assert "\n" in data
    assert images.decode_image(data, "x", LIMIT).size == (50, 40)


def _png_header_bomb(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height, with a few bytes of data: a few KB on the wire."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(b"\x00" * 4096)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def test_pixel_limit_is_checked_before_decoding():
    bomb = _png_header_bomb(20_000, 20_000)
    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=r"20000x20000 = 400000000 pixels, over the limit of 40000000"):
        images.decode_image(bomb, "payload.img", LIMIT)
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 10 * 2**20


# ---- ultralytics letterbox / scale_boxes: the yolov5 7.0.14 reference (tests/yolov5_reference.py) ---


def reference_letterbox(im):
    return yolov5_reference.letterbox(im, (640, 640), color=(114, 114, 114), auto=False)


def reference_scale_boxes(img1_shape, boxes, img0_shape):
    return yolov5_reference.scale_boxes(img1_shape, boxes, img0_shape)


@pytest.mark.parametrize("width, height, seed", SIZES + [(640, 640, 9), (100, 60, 10), (1, 1, 11), (641, 3, 12)])
def test_letterbox_equals_ultralytics_pixel_for_pixel(width, height, seed):
    pixels = np.asarray(photo(width, height, seed))
    ours, ratio, pad = images.letterbox(pixels, 640, (114, 114, 114))
    theirs, (r, _), their_pad = reference_letterbox(pixels.copy())
    assert ours.shape == (640, 640, 3)
    assert np.array_equal(ours, theirs)
    assert (ratio, pad) == (r, their_pad)


@pytest.mark.parametrize("width, height", [(768, 576), (576, 768), (1000, 120), (640, 640)])
def test_scale_boxes_inverts_letterbox(width, height):
    rng = np.random.default_rng(width)
    x1, y1 = rng.uniform(0, width - 50, 20), rng.uniform(0, height - 50, 20)
    boxes = np.stack([x1, y1, x1 + rng.uniform(1, 50, 20), y1 + rng.uniform(1, 50, 20)], 1).astype(np.float32)
    _, ratio, (_dw, _dh) = images.letterbox(np.zeros((height, width, 3), np.uint8), 640)
    # forward with the unrounded padding scale_boxes assumes
    pad_x, pad_y = (640 - width * ratio) / 2, (640 - height * ratio) / 2
    forward = boxes * ratio + np.array([pad_x, pad_y, pad_x, pad_y], dtype=np.float32)
    back = images.scale_boxes((640, 640), forward, (height, width))
    np.testing.assert_allclose(back, boxes, atol=1e-3)
    reference = reference_scale_boxes((640, 640), torch.from_numpy(forward.copy()), (height, width)).numpy()
    np.testing.assert_allclose(back, reference, rtol=0, atol=1e-4)


def test_scale_boxes_clips():
    boxes = np.array([[-10, -10, 700, 700]], dtype=np.float32)
    assert images.scale_boxes((640, 640), boxes, (480, 640)).tolist() == [[0, 0, 640, 480]]


# ---- YOLOv5 non_max_suppression: the yolov5 7.0.14 reference (single image, no masks) -------------


def reference_nms(prediction, conf_thres=0.25, iou_thres=0.45, max_det=300):
    found = yolov5_reference.non_max_suppression(
        torch.from_numpy(prediction)[None], conf_thres, iou_thres, max_det=max_det
    )
    return found[0].numpy()


@pytest.mark.parametrize(
    "seed, conf, iou, max_det",
    [
        (0, 0.25, 0.45, 300),
        (1, 0.1, 0.45, 300),
        (2, 0.5, 0.3, 5),
        (3, 0.001, 0.6, 300),
        (4, 0.25, 0.0, 300),
        (5, 0.99, 0.45, 300),
    ],
)
def test_nms_equals_yolov5(seed, conf, iou, max_det):
    output = planted_output(seed)
    ours = images.non_max_suppression(output, conf, iou, max_det)
    theirs = reference_nms(output.copy(), conf, iou, max_det)
    assert ours.shape == theirs.shape
    assert np.array_equal(ours[:, 5], theirs[:, 5])
    np.testing.assert_allclose(ours[:, 4], theirs[:, 4], rtol=0, atol=1e-5)
    if len(ours):
        iou_pairs = torchvision.ops.box_iou(torch.from_numpy(ours[:, :4]), torch.from_numpy(theirs[:, :4])).diagonal()
        assert float(iou_pairs.min()) >= 0.999


def test_nms_on_hand_made_boxes():
    out = np.zeros((6, 7), dtype=np.float32)  # two classes
    out[0] = (100, 100, 50, 50, 0.9, 0.9, 0.1)  # class 0, kept
    out[1] = (102, 101, 50, 50, 0.9, 0.8, 0.1)  # overlaps 0, same class: suppressed
    out[2] = (102, 101, 50, 50, 0.9, 0.1, 0.7)  # same place, class 1: kept
    out[3] = (300, 300, 40, 40, 0.8, 0.0, 0.5)  # class 1 elsewhere: kept (0.4)
    out[4] = (400, 400, 40, 40, 0.2, 1.0, 0.0)  # objectness under the threshold
    out[5] = (500, 500, 40, 40, 0.5, 0.4, 0.0)  # conf 0.2 under the threshold
    found = images.non_max_suppression(out, 0.25, 0.45, 300)
    assert found[:, 5].tolist() == [0, 1, 1]
    np.testing.assert_allclose(found[:, 4], [0.81, 0.63, 0.4], atol=1e-6)
    np.testing.assert_allclose(found[0, :4], [75, 75, 125, 125])
    assert len(images.non_max_suppression(out, 0.25, 0.45, 1)) == 1
    assert images.non_max_suppression(out, 0.95, 0.45, 300).shape == (0, 6)


def test_per_channel_scale_and_offset():
    lut = images.normalize_lut(scale=[1 / 255, 2 / 255, 1.0], offset=[0.0, -1.0, 0.5])
    assert lut.shape == (3, 256) and lut.dtype == np.float32
    assert lut[:, 255].tolist() == pytest.approx([1.0, 1.0, 255.5])
    assert lut[:, 0].tolist() == pytest.approx([0.0, -1.0, 0.5])


def test_opencv_runs_each_call_on_the_calling_thread_alone():
    """The sizing plan counts a router worker thread (and a python-step instance) as one CPU: OpenCV's
    own pool, one thread per core by default, would spread each letterbox over every core."""
    import subprocess
    import sys

    code = "import clients.images, cv2; print(cv2.getNumThreads())"
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split() == [
        "1"
    ]


def test_the_opencv_threads_benchmark_sets_one_thread_against_the_pool(capsys):
    """``python -m scripts.bench.opencv_threads``, a smoke run: both sides measured for every photo and
    caller count, the ratio printed, and OpenCV left on the one thread it had."""
    import cv2

    from scripts.bench import opencv_threads

    assert opencv_threads.main(["--callers", "1,2", "--rounds", "1", "--seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    for photo in opencv_threads.SIZES:
        for callers in (1, 2):
            assert f"{photo}, {callers} callers: one thread / pool: " in out
    rows = [line for line in out.splitlines() if line.startswith(tuple(opencv_threads.SIZES))]
    table = [line.split() for line in rows if "/" not in line]
    assert len(table) == 8 and all(float(row[-2]) > 0 for row in table)  # 2 photos x 2 caller counts x 2 sides
    assert cv2.getNumThreads() == 1
    with pytest.raises(SystemExit):
        opencv_threads.parse_args(["--callers", "0"])
