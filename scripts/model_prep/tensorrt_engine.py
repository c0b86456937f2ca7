"""Build a TensorRT engine (``model.plan``) from an ONNX export with the TensorRT Python API."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from app.core.spec import ModelSpec


class EngineError(RuntimeError):
    """TensorRT could not parse the ONNX graph or build the engine."""


def missing_requirements() -> str | None:
    """None when an engine can be built here; else one line naming what is missing."""
    has_trt = importlib.util.find_spec("tensorrt") is not None
    has_gpu = _gpu_visible()
    if has_trt and has_gpu:
        return None
    package = "the TensorRT Python package (pip install tensorrt)"
    if not has_trt and not has_gpu:
        found = f"{package} and an NVIDIA GPU; found neither"
    elif not has_trt:
        found = f"{package}; it is not installed"
    else:
        found = "an NVIDIA GPU; none is visible"
    return f"prepare_models: --target tensorrt needs {found}"


def _gpu_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def build_engine(
    onnx_path: Path, plan_path: Path, spec: ModelSpec, max_batch_size: int, precision: str, timing_cache: Path
) -> None:
    """One optimisation profile: batch 1 (min), max_batch_size (opt and max); a text model's sequence
    axis from 1 token (min) to its sequence length (opt and max)."""
    import onnx
    import tensorrt as trt

    from scripts.model_prep import tensorrt_operators

    refused = tensorrt_operators.problems(onnx.load(str(onnx_path), load_external_data=False))
    if refused:  # named before TensorRT's own, less readable, parser error
        raise EngineError(f"[{spec.name}] {onnx_path} has what TensorRT's ONNX parser refuses: " + "; ".join(refused))
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"[{spec.name}] TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    from scripts.model_prep.detector_graph import served_tensors

    profile = builder.create_optimization_profile()
    for tensor in served_tensors(spec)[0]:  # a detector's graph also takes its geometry and options
        longest = spec.text.sequence_length if spec.text else 1
        largest = (max_batch_size, *(longest if d < 0 else d for d in tensor.dims))
        profile.set_shape(tensor.name, (1, *(1 if d < 0 else d for d in tensor.dims)), largest, largest)
    config.add_optimization_profile(profile)
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError(f"[{spec.name}] TensorRT could not build an engine (see its log above)")
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(serialized))
    record_gpu(plan_path, trt.__version__)
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))


def record_gpu(plan_path: Path, tensorrt_version: str) -> None:
    """Write the GPU the plan was built on beside it (model.plan.gpu.json): `serve` refuses the
    plan on another GPU type (app/serve/engines.py). TensorRT builds on the first visible device."""
    from app.serve import engines

    gpus = engines.detect_gpus()
    if gpus:
        engines.write_record(plan_path, gpus[0], tensorrt_version)


def _network_flags(trt) -> int:
    """Explicit batch: a flag before TensorRT 10, the only mode (and deprecated flag) since."""
    if int(trt.__version__.split(".")[0]) >= 10:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)


def load_engine(plan_path: Path):
    """Deserialize a plan; None when TensorRT rejects it."""
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    return runtime.deserialize_cuda_engine(plan_path.read_bytes())
