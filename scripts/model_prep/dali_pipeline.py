"""An image model's preprocessing as an NVIDIA DALI pipeline, for Triton's DALI backend.

``<name>_preprocess`` takes one encoded image per sample (``IMAGE``, UINT8 [-1], zero-padded in a
batch) with its length (``IMAGE_LENGTH``, INT64 [1]: only those bytes are decoded, so a truncated
image fails as it does in the router) and gives the network's input tensor; a detector's step
gives ``IMAGE_SIZE`` too (INT64 [2]: height, width as displayed). Both reproduce the router's
pixels (``clients.images``):

- decoding applies the EXIF orientation (the decoders' ``adjust_orientation``, on by default) and
  decodes JPEG with libjpeg's "fancy" chroma upsampling, as PIL does (``mixed``: nvJPEG asked to);
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
project is not installed), and ``build_cpu_pipeline`` runs it with DALI's CPU operators.
"""

from __future__ import annotations

import inspect
import pprint
from typing import Any, Mapping, Sequence

from tritonclient.grpc import model_config_pb2 as mc

from app.core.pipeline import IMAGE, IMAGE_LENGTH, IMAGE_SIZE, preprocess_model
from app.core.spec import ModelSpec, SpecError
from scripts.model_prep.triton_config import data_type, to_text

CLASSIFICATION, DETECTION = "image_classification", "detection"
LETTERBOX_COLOR = (114, 114, 114)
DALI_TYPES = {"FP32": "FLOAT", "FP16": "FLOAT16", "UINT8": "UINT8"}  # Triton dtype -> nvidia.dali.types
PIPELINE_FILE = "dali.py"  # what the DALI backend autoserializes from the version folder
GPU_THREADS = 4  # CPU threads of the GPU pipeline (Huffman decoding, argument arithmetic)

__all__ = [
    "PIPELINE_FILE", "build_cpu_pipeline", "pipeline_file", "preprocess_config", "preprocess_graph",
    "preprocess_params", "run_cpu",
]


def preprocess_graph(params, device):
    """The body of a DALI pipeline: encoded images (an external source named ``params["image"]``)
    in, ``(network input,)`` or ``(network input, image size)`` out. ``params``:
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
    encoded = fn.slice(encoded, start=[0], shape=fn.cast(length, dtype=types.INT32), axes=[0],
                       out_of_bounds_policy="error")  # the image's own bytes, not the batch's padding
    decoder = {"device": "mixed", "jpeg_fancy_upsampling": True} if device == "gpu" else {"device": "cpu"}
    image = fn.decoders.image(encoded, output_type=getattr(types, params["channels"]), **decoder)
    shape = fn.peek_image_shape(encoded)  # [H, W, C] as decoded: EXIF orientation applied
    height, width = shape[0], shape[1]
    if params["letterbox"]:
        size, longer = params["size"], math.max(height, width)
        new_h, new_w = round_half_even(height * size, longer), round_half_even(width * size, longer)
        image = fn.resize(image, size=fn.cast(fn.stack(new_h, new_w), dtype=types.FLOAT),
                          interp_type=types.INTERP_LINEAR, antialias=False)
        # top, left padding: the smaller half, as ultralytics' round(pad / 2 - 0.1); the slice starts
        # that far before the image (floor of a non-negative number: the same in DALI's C-style //)
        anchor = fn.stack(0 - (size - new_h) // 2, 0 - (size - new_w) // 2)
        image = fn.slice(image, cast(anchor, types.INT32), [size, size], axis_names="HW",
                         out_of_bounds_policy="pad", fill_values=params["pad_color"])
    else:
        resize, crop = params["resize"], params["crop"]
        width_short = cast(width <= height)  # torchvision: the short side to resize, the long one truncated
        new_w = width_short * resize + (1 - width_short) * (resize * width // height)
        new_h = width_short * (resize * height // width) + (1 - width_short) * resize
        # only the crop's region is resized: the input region it maps to, same scale and sample
        # positions as resizing the whole image and cropping (measured: within 1 level of that)
        top, left = round_half_even(new_h - crop, 2), round_half_even(new_w - crop, 2)
        scale_y, scale_x = cast(height, types.FLOAT) / new_h, cast(width, types.FLOAT) / new_w
        image = fn.resize(image, size=[crop, crop], interp_type=types.INTERP_LINEAR, antialias=True,
                          roi_start=fn.stack(top * scale_y, left * scale_x),
                          roi_end=fn.stack((top + crop) * scale_y, (left + crop) * scale_x))
    tensor = fn.crop_mirror_normalize(
        image, dtype=getattr(types, params["dtype"]), output_layout=params["layout"],
        mean=params["mean"], std=params["std"],
    )
    if not params["image_size"]:
        return (tensor,)
    return tensor, shape[0:2]


def _floats(value: Any, where: str, count: tuple[int, ...] = (1, 3)) -> list[float]:
    """One number (for each channel) or three, as floats; ``where`` names the key."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    try:
        values = [float(v) for v in items if not isinstance(v, bool)]
    except (TypeError, ValueError):
        values = []
    if len(values) != len(items) or len(values) not in count:
        raise SpecError(f"{where}: {' or '.join(map(str, count))} numbers expected, got {value!r}")
    return values * 3 if len(values) == 1 else values


def _int(pre: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = pre.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{where} {key}: a positive integer expected, got {value!r}")
    return value


def preprocess_params(spec: ModelSpec) -> dict[str, Any]:
    """The spec's ``[preprocess]`` as the plain values ``preprocess_graph`` takes; a SpecError
    names the key of a value it cannot take (the router's client takes the same settings)."""
    pre, tensor = spec.preprocess, spec.inputs[0]
    toml = f"{spec.folder}/model.toml:"
    where, dims = f"{toml} [preprocess]", f"{toml} inputs[0].dims {list(tensor.dims)}"
    layout, channels = str(pre.get("layout", "NCHW")).upper(), str(pre.get("channels", "RGB")).upper()
    if layout not in ("NCHW", "NHWC"):
        raise SpecError(f"{where} layout: NCHW or NHWC expected, got {pre['layout']!r}")
    if channels not in ("RGB", "BGR"):
        raise SpecError(f"{where} channels: RGB or BGR expected, got {pre['channels']!r}")
    if tensor.dtype not in DALI_TYPES:
        raise SpecError(f"{toml} inputs[0].dtype {tensor.dtype} is not one of {sorted(DALI_TYPES)}")
    channel_axis = 0 if layout == "NCHW" else 2
    if len(tensor.dims) != 3 or tensor.dims[channel_axis] != 3:
        raise SpecError(f"{dims}: not a 3-channel image in layout {layout}")
    height, width = tensor.dims[1:] if layout == "NCHW" else tensor.dims[:2]
    if height != width:
        raise SpecError(f"{dims}: the image is {height}x{width}; square inputs only")
    if spec.family not in (CLASSIFICATION, DETECTION):
        raise SpecError(f"{toml} family {spec.family}: no DALI preprocessing for it")
    letterbox = pre.get("letterbox", False)
    if not isinstance(letterbox, bool):
        raise SpecError(f"{where} letterbox: true or false expected, got {letterbox!r}")
    letterbox = letterbox or spec.family == DETECTION  # a detector always letterboxes
    params: dict[str, Any] = {
        "image": IMAGE, "image_length": IMAGE_LENGTH, "channels": channels, "layout": layout[1:], "dtype": DALI_TYPES[tensor.dtype],
        "image_size": spec.family == DETECTION, "letterbox": letterbox,
    }
    if letterbox:
        for key in ("resize", "crop", "fast_path"):
            if key in pre:
                raise SpecError(f"{where} {key}: applies to resize and crop, not to letterbox")
        params["size"] = _int(pre, "size", width, where)
        if params["size"] != width:
            raise SpecError(f"{where} size {params['size']} does not fit the input {list(tensor.dims)}")
        color = _floats(pre.get("pad_color", LETTERBOX_COLOR), f"{where} pad_color", count=(3,))
        if not all(0 <= c <= 255 for c in color):
            raise SpecError(f"{where} pad_color: values 0 to 255 expected, got {pre['pad_color']!r}")
        params["pad_color"] = color[::-1] if channels == "BGR" else color  # given in RGB, as the router's
    else:
        if "pad_color" in pre or "size" in pre:
            raise SpecError(f"{where} {'pad_color' if 'pad_color' in pre else 'size'}: applies to letterbox only")
        params["crop"] = _int(pre, "crop", width, where)
        params["resize"] = _int(pre, "resize", params["crop"], where)
        if params["crop"] != width:
            raise SpecError(f"{where} crop {params['crop']} does not fit the input {list(tensor.dims)}")
        if params["resize"] < params["crop"]:
            raise SpecError(f"{where} resize {params['resize']} is smaller than crop {params['crop']}")
    # crop_mirror_normalize computes (v - mean) / std on 0..255 values, in the model's channel order
    given = [key for key in ("mean", "std", "scale", "offset") if key in pre]
    if tensor.dtype == "UINT8":
        if given:
            raise SpecError(f"{where} {given[0]}: a UINT8 input takes the pixels as they are, without normalisation")
        params["mean"], params["std"] = [0.0] * 3, [1.0] * 3
    elif "mean" in pre or "std" in pre:
        if "scale" in pre or "offset" in pre:
            raise SpecError(f"{where} {'scale' if 'scale' in pre else 'offset'}: give mean and std, or scale "
                            "and offset, not both")
        missing = "std" if "mean" in pre else "mean"
        if missing not in pre:
            raise SpecError(f"{where} {missing}: missing (mean and std go together)")
        params["mean"] = [255 * m for m in _floats(pre["mean"], f"{where} mean")]
        params["std"] = [255 * s for s in _floats(pre["std"], f"{where} std")]
        if 0 in params["std"]:
            raise SpecError(f"{where} std: zero")
    else:  # v * scale + offset == (v - (-offset / scale)) / (1 / scale)
        default = 1 / 255 if spec.family == DETECTION else None
        if pre.get("scale", default) is None:
            raise SpecError(f"{where} mean, std or scale: normalisation needs mean and std, or scale (and offset)")
        scale = _floats(pre.get("scale", default), f"{where} scale")
        offset = _floats(pre.get("offset", 0.0), f"{where} offset")
        if 0 in scale:
            raise SpecError(f"{where} scale: zero")
        params["mean"] = [-o / s if o else 0.0 for o, s in zip(offset, scale)]
        params["std"] = [1 / s for s in scale]
    return params


def _outputs(spec: ModelSpec) -> list[tuple[str, str, Sequence[int]]]:
    """(name, Triton dtype, dims) of the step's outputs, in the pipeline's order."""
    outputs = [(spec.inputs[0].name, spec.inputs[0].dtype, spec.inputs[0].dims)]
    if spec.family == DETECTION:
        outputs.append((IMAGE_SIZE, "INT64", (2,)))
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
        model=preprocess_model(spec.name), name=spec.name,
        description=(spec.description or spec.name).replace('"', "'"),
        params=pprint.pformat(preprocess_params(spec), sort_dicts=False), graph=inspect.getsource(preprocess_graph),
        batch_size=max_batch_size or spec.max_batch_size, threads=GPU_THREADS,
        output_dtypes=", ".join(f"types.{DALI_TYPES.get(dtype, dtype)}" for _, dtype, _ in outputs),
        output_ndims=", ".join(str(len(dims)) for _, _, dims in outputs),
    )


def preprocess_config(spec: ModelSpec, max_batch_size: int) -> mc.ModelConfig:
    """``<name>_preprocess``'s config: the DALI backend on the GPU, one encoded image a sample
    (ragged: requests with images of different lengths are batched together)."""
    preprocess_params(spec)  # the spec's settings checked before anything is written
    config = mc.ModelConfig(name=preprocess_model(spec.name), backend="dali", max_batch_size=max_batch_size)
    config.input.add(name=IMAGE, data_type=data_type("UINT8"), dims=[-1], allow_ragged_batch=True)
    config.input.add(name=IMAGE_LENGTH, data_type=data_type("INT64"), dims=[1])
    for name, dtype, dims in _outputs(spec):
        config.output.add(name=name, data_type=data_type(dtype), dims=dims)
    config.dynamic_batching.max_queue_delay_microseconds = spec.max_queue_delay_microseconds
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU)
    return config


def preprocess_config_text(spec: ModelSpec, max_batch_size: int) -> str:
    return to_text(preprocess_config(spec, max_batch_size))


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
