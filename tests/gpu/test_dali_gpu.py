"""The image models' DALI steps on the GPU, as Triton's DALI backend runs them: the ``dali.py`` model
preparation writes, serialised by the backend's own autoserialization script, deserialised on
device 0 with the config's ``num_threads`` (scripts/gpu_check/serialized.py), fed the 11 sample
photos (tests.references.real_photos), ``mixed`` decoding with nvJPEG:

- against the references and tolerances of the CPU tests (tests/dali_support.py): resnet,
  torchvision's ``Resize(256)`` + ``CenterCrop(224)``; yolov5, ultralytics' letterbox, with
  ``IMAGE_SIZE`` and the letterbox's gain and padding; for ``decoder = "exact"`` and ``"fast"``
  (measured on an H100 before: exact 0.10-0.18 / 0.00-0.12 levels of 255, fast 0.35-0.40);
- the exact decoder against DALI's CPU pipeline (the same graph, libjpeg's decoding): within 1 level;
- EXIF orientations 1-8 and the batch's zero padding, as on the CPU.

Every test is skipped, with the reason, where there is no NVIDIA GPU or no DALI (``make gpu-check``
installs DALI's CUDA wheel and runs them).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from clients import images
from scripts.gpu_check import serialized
from scripts.model_prep import dali_pipeline
from tests.dali_support import (
    MEAN_LEVELS,
    ROUTER_MEAN_LEVELS,
    displayed,
    mean_levels,
    model_spec,
    png,
    reference_levels,
    to_levels,
    with_orientation,
)
from tests.references import real_photos

MISSING = serialized.gpu_missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]
MODELS = ["resnet", "yolov5"]
EXIF_PHOTO = "dog.jpg"


@pytest.fixture(scope="module")
def photos() -> dict[str, bytes]:
    return real_photos()


@pytest.fixture(scope="module")
def gpu_pipelines(tmp_path_factory):
    """One serialised pipeline a (model, decoder, batch size), deserialised as the backend does."""
    built: dict = {}

    def get(model: str, decoder: str, batch: int):
        key = (model, decoder, batch)
        if key not in built:
            spec = serialized.with_decoder(model_spec(model), decoder)
            config = dali_pipeline.preprocess_config(spec, batch)
            threads = int(config.parameters["num_threads"].string_value)  # what the backend reads
            folder = tmp_path_factory.mktemp(f"{model}-{decoder}-{batch}")
            built[key] = serialized.serialized_pipeline(spec, folder, batch, threads)
        return built[key]

    return get


@pytest.mark.parametrize("decoder", serialized.DECODERS)
@pytest.mark.parametrize("model", MODELS)
def test_gpu_step_equals_the_references(gpu_pipelines, photos, model, decoder):
    spec, names = model_spec(model), sorted(photos)
    encoded = [photos[n] for n in names]
    outputs = serialized.run_to_cpu(gpu_pipelines(model, decoder, len(names)), encoded)
    cpu = dali_pipeline.run_cpu(dali_pipeline.build_cpu_pipeline(spec, batch_size=len(names), num_threads=2), encoded)
    means = []
    for k, name in enumerate(names):
        ours = outputs[0][k]
        assert ours.shape == spec.inputs[0].dims and ours.dtype == spec.inputs[0].numpy_dtype
        mean, top = mean_levels(spec, ours, reference_levels(model, photos[name]))
        from_cpu, _ = mean_levels(spec, ours, to_levels(spec, cpu[0][k]))
        means.append(mean)
        print(
            f"\n{model} {decoder} {name}: mean |GPU - reference| {mean:.3f} levels (max {top:.0f}), "
            f"|GPU - DALI CPU| {from_cpu:.3f}"
        )
        assert mean <= MEAN_LEVELS[model]
        if decoder == "exact":
            assert from_cpu <= ROUTER_MEAN_LEVELS
        if spec.family == "detection":
            pixels = displayed(photos[name])
            assert outputs[1][k].tolist() == list(pixels.shape[:2])
            gain, pad_x, pad_y = images.letterbox_geometry((640, 640), tuple(pixels.shape[:2]))
            np.testing.assert_allclose(outputs[2][k], [gain, pad_x, pad_y], rtol=1e-6, atol=1e-4)
    print(f"\n{model} decoder {decoder}: mean over the photos {np.mean(means):.3f}, {min(means):.3f}-{max(means):.3f}")


@pytest.mark.parametrize("model", MODELS)
def test_exif_orientation_on_the_gpu(gpu_pipelines, photos, model):
    """A JPEG tagged 1-8 gives the image turned as displayed (against the turned image as PNG:
    nvJPEG's pixels are not libjpeg's to the bit, so within the references' tolerance)."""
    spec, plain = model_spec(model), photos[EXIF_PHOTO]
    tagged = {o: with_orientation(plain, o) for o in range(1, 9)}
    turned = {o: ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB") for o, data in tagged.items()}
    batch = [*tagged.values(), *(png(image) for image in turned.values())]
    outputs = serialized.run_to_cpu(gpu_pipelines(model, "exact", len(batch)), batch)
    for k, orientation in enumerate(tagged):
        mean, _ = mean_levels(spec, outputs[0][k], to_levels(spec, outputs[0][k + len(tagged)]))
        print(f"\n{model} orientation {orientation}: mean |JPEG - turned PNG| {mean:.3f} levels")
        assert mean <= MEAN_LEVELS[model], f"orientation {orientation}"
        if spec.family == "detection":
            assert outputs[1][k].tolist() == [turned[orientation].height, turned[orientation].width]


def test_zero_padding_after_the_image_is_cut_off_by_its_length(gpu_pipelines, photos):
    batch = [photos["dog.jpg"], photos["chelsea.png"]]
    pipeline = gpu_pipelines("yolov5", "exact", len(batch))
    plain = serialized.run_to_cpu(pipeline, batch)
    padded = serialized.run_to_cpu(pipeline, [data + bytes(4096) for data in batch], [len(d) for d in batch])
    for a, b in zip(plain, padded):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
