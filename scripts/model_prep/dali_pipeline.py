"""An image model's preprocessing as an NVIDIA DALI pipeline, for Triton's DALI backend.

``<name>_preprocess`` takes one encoded image per sample (``IMAGE``, UINT8 [-1], zero-padded in a
batch) with its length (``IMAGE_LENGTH``, INT64 [1]: only those bytes are decoded, so a truncated
image fails as it does in the router) and gives the network's input tensor; a detector's step
gives ``IMAGE_SIZE`` too (INT64 [2]: height, width as displayed) and ``LETTERBOX`` (FP32 [3]: the
gain and x, y padding that YOLOv5's ``scale_boxes`` undoes, which the detector's graph takes). Both reproduce the router's
pixels (``clients.images``):

- decoding applies the EXIF orientation (the decoders' ``adjust_orientation``, on by default) and
  decodes JPEG with libjpeg's "fancy" chroma upsampling, as PIL does (``mixed``: nvJPEG asked to,
  unless the spec says ``[preprocess] decoder = "fast"``: nvJPEG's own upsampling, 30-40% more
  images/s measured on an H100 with 8 threads, a mean 0.35-0.40 levels of 255 from the references);
- ``image_classification``: torchvision ``Resize(resize)`` (short side to ``resize``, the long side
  truncated, bilinear with antialiasing as PIL filters) + ``CenterCrop(crop)`` (origin rounded half
  to even, as Python's ``round``), both computed in integers per image; only the crop's region
  of the image is resized;
- ``detection`` (and a classifier with ``letterbox = true``): ultralytics' letterbox, ``auto=False``:
  the long side to ``size``, the short one ``round(short * size / long)`` (half to even), bilinear
  without antialiasing like ``cv2.INTER_LINEAR``, padded with ``pad_color`` (top, left:
  ``round(pad / 2 - 0.1)``, the smaller half);
- then the spec's channel order, normalisation (mean/std or scale/offset), layout and dtype.

``preprocess_graph`` is the one definition: ``pipeline_file`` copies its source into the model's
``dali.py`` (run on the GPU, decoding on ``mixed``, by the backend's autoserialization, where this
project is not installed), and ``build_cpu_pipeline`` runs it with DALI's CPU operators (whose
decoder is libjpeg's: exact either way). Its parameters (``preprocess_params``) are the settings the
family's client checked and holds (``clients.families.offline_client``), copied into ``PARAMS`` as
plain values. The step's config (``preprocess_config``) gives the backend the pipeline's CPU threads
(its ``num_threads`` parameter, which overrides the file's own); scripts/gpu_check runs the file on
a GPU as the backend does.
"""

from __future__ import annotations

import inspect
import pprint
from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from app.core.pipeline import IMAGE, IMAGE_LENGTH, IMAGE_SIZE, LETTERBOX, preprocess_model
from app.core.settings import Settings
from app.core.spec import ModelSpec, SpecError
from clients.families import FAMILIES, family_of, offline_client
from scripts.model_prep.triton_config import data_type, to_text

DALI_TYPES = {"FP32": "FLOAT", "FP16": "FLOAT16", "UINT8": "UINT8"}  # Triton dtype -> nvidia.dali.types
PIPELINE_FILE = "dali.py"  # what the DALI backend autoserializes from the version folder
GPU_THREADS = 4  # CPU threads of the GPU pipeline (Huffman decoding, argument arithmetic)
THREADS_PARAMETER = "num_threads"  # the config.pbtxt parameter the DALI backend takes them from

__all__ = [
    "GPU_THREADS",
    "PIPELINE_FILE",
    "build_cpu_pipeline",
    "pipeline_file",
    "preprocess_config",
    "preprocess_graph",
    "preprocess_params",
    "run_cpu",
]


def preprocess_graph(params, device):
    """The body of a DALI pipeline: encoded images (an external source named ``params["image"]``)
    in, ``(network input,)`` or ``(network input, image size, letterbox gain and padding)`` out. ``params``:
    ``preprocess_params``'s dict; ``device``: ``"gpu"`` (decoding on ``mixed``, the rest on the GPU)
    or ``"cpu"``. Self-contained and unannotated: ``pipeline_file`` copies this source into a file
    that imports DALI only.
    """
    from nvidia.dali import fn, math, types

    def cast(node, dtype=types.INT64):
        return fn.cast(node, dtype=dtype)

    def round_half_even(num, den):  # Python's round(num / den) on positive integers, exactly
        quotient = num // den
        twice_rest = (num - quotient * den) * 2
        return quotient + cast(twice_rest > den) + cast(twice_rest == den) * (quotient % 2)

    encoded = fn.external_source(device="cpu", name=params["image"], dtype=types.UINT8, ndim=1)
    length = fn.external_source(device="cpu", name=params["image_length"], dtype=types.INT64, ndim=1)
    encoded = fn.slice(
        encoded, start=[0], shape=fn.cast(length, dtype=types.INT32), axes=[0], out_of_bounds_policy="error"
    )  # the image's own bytes, not the batch's padding
    exact = params["decoder"] == "exact"  # libjpeg's chroma upsampling (PIL's pixels), or nvJPEG's own
    decoder = {"device": "mixed", "jpeg_fancy_upsampling": exact} if device == "gpu" else {"device": "cpu"}
    image = fn.decoders.image(encoded, output_type=getattr(types, params["channels"]), **decoder)
    shape = fn.peek_image_shape(encoded)  # [H, W, C] as decoded: EXIF orientation applied
    height, width = shape[0], shape[1]
    if params["letterbox"]:
        size, longer = params["size"], math.max(height, width)
        new_h, new_w = round_half_even(height * size, longer), round_half_even(width * size, longer)
        image = fn.resize(
            image,
            size=fn.cast(fn.stack(new_h, new_w), dtype=types.FLOAT),
            interp_type=types.INTERP_LINEAR,
            antialias=False,
        )
        # top, left padding: the smaller half, as ultralytics' round(pad / 2 - 0.1); the slice starts
        # that far before the image (floor of a non-negative number: the same in DALI's C-style //)
        anchor = fn.stack(0 - (size - new_h) // 2, 0 - (size - new_w) // 2)
        image = fn.slice(
            image,
            cast(anchor, types.INT32),
            [size, size],
            axis_names="HW",
            out_of_bounds_policy="pad",
            fill_values=params["pad_color"],
        )
    else:
        resize, crop = params["resize"], params["crop"]
        width_short = cast(width <= height)  # torchvision: the short side to resize, the long one truncated
        new_w = width_short * resize + (1 - width_short) * (resize * width // height)
        new_h = width_short * (resize * height // width) + (1 - width_short) * resize
        # only the crop's region is resized: the input region it maps to, same scale and sample
        # positions as resizing the whole image and cropping (measured: within 1 level of that)
        top, left = round_half_even(new_h - crop, 2), round_half_even(new_w - crop, 2)
        scale_y, scale_x = cast(height, types.FLOAT) / new_h, cast(width, types.FLOAT) / new_w
        image = fn.resize(
            image,
            size=[crop, crop],
            interp_type=types.INTERP_LINEAR,
            antialias=True,
            roi_start=fn.stack(top * scale_y, left * scale_x),
            roi_end=fn.stack((top + crop) * scale_y, (left + crop) * scale_x),
        )
    tensor = fn.crop_mirror_normalize(
        image,
        dtype=getattr(types, params["dtype"]),
        output_layout=params["layout"],
        mean=params["mean"],
        std=params["std"],
    )
    if not params["image_size"]:
        return (tensor,)
    # scale_boxes' gain and padding: size / the long side, half of what the scaled image leaves
    size, high, wide = float(params["size"]), cast(height, types.FLOAT), cast(width, types.FLOAT)
    gain = size / math.max(high, wide)
    return tensor, shape[0:2], fn.stack(gain, (size - wide * gain) / 2, (size - high * gain) / 2)


def preprocess_params(spec: ModelSpec) -> dict[str, Any]:
    """The plain values ``preprocess_graph`` takes, from the settings the family's client checked
    (``clients.vision``, ``clients.classification``, ``clients.detection``): a SpecError names the
    file and the key of a value the model cannot take, as at the router's start."""
    family = family_of(spec)
    if not family.dali:
        raise SpecError(
            f"{spec.folder}/model.toml: family {spec.family}: no DALI preprocessing for it "
            f"(families: {', '.join(name for name, each in FAMILIES.items() if each.dali)})"
        )
    client = offline_client(spec, Settings())
    params: dict[str, Any] = {
        "image": IMAGE,
        "image_length": IMAGE_LENGTH,
        "channels": client.channels,
        "layout": client.layout[1:],
        "dtype": DALI_TYPES[client.dtype],
        "image_size": family.graph_postprocess,  # the letterbox's geometry, for the graph's box scaling
        "letterbox": client.letterbox,
        "decoder": client.decoder,
    }
    if client.letterbox:
        params["size"] = client.size
        # given in RGB, as the router pads before its channel order; DALI pads the decoded channels
        params["pad_color"] = list(client.pad_color[::-1] if client.channels == "BGR" else client.pad_color)
    else:
        params["resize"], params["crop"] = client.resize, client.crop
    # crop_mirror_normalize computes (v - mean) / std on 0..255 values, in the model's channel order
    if client.mean is not None:  # (v / 255 - mean) / std == (v - 255 * mean) / (255 * std)
        params["mean"], params["std"] = [255 * m for m in client.mean], [255 * s for s in client.std]
    elif client.scale is not None:  # v * scale + offset == (v - (-offset / scale)) / (1 / scale)
        params["mean"] = [-o / s if o else 0.0 for o, s in zip(client.offset, client.scale)]
        params["std"] = [1 / s for s in client.scale]
    else:  # a UINT8 input: the pixels as they are
        params["mean"], params["std"] = [0.0] * 3, [1.0] * 3
    return params


def _outputs(spec: ModelSpec) -> list[tuple[str, str, Sequence[int]]]:
    """(name, Triton dtype, dims) of the step's outputs, in the pipeline's order."""
    outputs = [(spec.inputs[0].name, spec.inputs[0].dtype, spec.inputs[0].dims)]
    if family_of(spec).graph_postprocess:
        outputs.extend([(IMAGE_SIZE, "INT64", (2,)), (LETTERBOX, "FP32", (3,))])
    return outputs


FILE_TEMPLATE = '''\
"""{model}: {description} preprocessing as an NVIDIA DALI pipeline.

Serialised by Triton's DALI backend when it loads the model (autoserialization). Written by
scripts/model_prep/dali_pipeline.py from models/{name}/model.toml: edit that, not this file.
"""

from nvidia.dali import pipeline_def, types
from nvidia.dali.plugin.triton import autoserialize

PARAMS = {params}


{graph}

@autoserialize
@pipeline_def(batch_size={batch_size}, num_threads={threads}, device_id=0,
              output_dtype=[{output_dtypes}], output_ndim=[{output_ndims}])
def preprocess():
    return preprocess_graph(PARAMS, "gpu")
'''


def pipeline_file(spec: ModelSpec, max_batch_size: int | None = None) -> str:
    """The text of ``<name>_preprocess/1/dali.py``: ``preprocess_graph``'s source and the spec's values,
    importing nothing but DALI (the NGC image does not have this project)."""
    outputs = _outputs(spec)
    return FILE_TEMPLATE.format(
        model=preprocess_model(spec.name),
        name=spec.name,
        description=(spec.description or spec.name).replace('"', "'"),
        params=pprint.pformat(preprocess_params(spec), sort_dicts=False),
        graph=inspect.getsource(preprocess_graph),
        batch_size=max_batch_size or spec.max_batch_size,
        threads=GPU_THREADS,
        output_dtypes=", ".join(f"types.{DALI_TYPES.get(dtype, dtype)}" for _, dtype, _ in outputs),
        output_ndims=", ".join(str(len(dims)) for _, _, dims in outputs),
    )


def preprocess_config(spec: ModelSpec, max_batch_size: int, threads: int = GPU_THREADS) -> mc.ModelConfig:
    """``<name>_preprocess``'s config: the DALI backend on the GPU, one encoded image a sample
    (ragged: requests with images of different lengths are batched together), ``threads`` CPU
    threads for the pipeline (the backend's ``num_threads`` parameter, which overrides the
    serialised pipeline's own)."""
    preprocess_params(spec)  # the spec's settings checked before anything is written
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{preprocess_model(spec.name)}: threads must be a positive integer, got {threads!r}")
    config = mc.ModelConfig(name=preprocess_model(spec.name), backend="dali", max_batch_size=max_batch_size)
    config.input.add(name=IMAGE, data_type=data_type("UINT8"), dims=[-1], allow_ragged_batch=True)
    config.input.add(name=IMAGE_LENGTH, data_type=data_type("INT64"), dims=[1])
    for name, dtype, dims in _outputs(spec):
        config.output.add(name=name, data_type=data_type(dtype), dims=dims)
    config.dynamic_batching.max_queue_delay_microseconds = spec.max_queue_delay_microseconds
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU)
    config.parameters[THREADS_PARAMETER].string_value = str(threads)
    return config


def preprocess_config_text(spec: ModelSpec, max_batch_size: int, threads: int = GPU_THREADS) -> str:
    return to_text(preprocess_config(spec, max_batch_size, threads))


def build_cpu_pipeline(spec: ModelSpec, batch_size: int, num_threads: int = 1):
    """``preprocess_graph`` on DALI's CPU operators (no GPU needed), built; feed it with ``run_cpu``."""
    from nvidia.dali import pipeline_def

    params = preprocess_params(spec)

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None, prefetch_queue_depth=1)
    def preprocess():
        return preprocess_graph(params, "cpu")

    pipeline = preprocess()
    pipeline.build()
    return pipeline


def run_cpu(pipeline, images: Sequence[bytes], lengths: Sequence[int] | None = None) -> list[list]:
    """One batch of encoded images through a ``build_cpu_pipeline`` pipeline: per output, one
    numpy array a sample. ``lengths``: the bytes of each that are the image (all by default)."""
    import numpy as np

    lengths = [len(data) for data in images] if lengths is None else lengths
    pipeline.feed_input(IMAGE, [np.frombuffer(data, dtype=np.uint8) for data in images])
    pipeline.feed_input(IMAGE_LENGTH, [np.array([n], dtype=np.int64) for n in lengths])
    return [[np.array(batch[i]) for i in range(len(images))] for batch in pipeline.run()]
