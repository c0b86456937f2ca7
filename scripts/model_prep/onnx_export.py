"""Export a recipe's torch module to ONNX, check it, and cache it by model and weights source."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.spec import ModelSpec, TensorSpec

OPSET = 17
CHECK_BATCH = 2
ONNX_FILE = "model.onnx"
REPORT_FILE = "export.json"


class ExportError(RuntimeError):
    """An export that failed a check; the message names the model and the check."""


@dataclass(frozen=True)
class ExportResult:
    path: Path
    sha256: str
    max_abs_diff: dict[str, float]
    tolerance: dict[str, float]
    cached: bool


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def graph_tensors(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The ONNX graph's inputs and outputs as specs; a dynamic dimension is -1."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    from app.core.spec import TRITON_TO_NUMPY

    numpy_to_triton = {dtype: name for name, dtype in TRITON_TO_NUMPY.items()}
    graph = onnx.load(str(path), load_external_data=False).graph

    def convert(value) -> TensorSpec:
        tensor_type = value.type.tensor_type
        dims = tuple(-1 if _symbolic(d) else d.dim_value for d in tensor_type.shape.dim)
        dtype = numpy_to_triton.get(np.dtype(tensor_dtype_to_np_dtype(tensor_type.elem_type)), "UNKNOWN")
        return TensorSpec(name=value.name, dtype=dtype, dims=dims)

    initializers = {i.name for i in graph.initializer}
    inputs = [convert(v) for v in graph.input if v.name not in initializers]
    return inputs, [convert(v) for v in graph.output]


def _symbolic(dim) -> bool:
    """An ONNX dimension without a known size: a name (``dim_param``), nothing, or a negative value."""
    return not dim.HasField("dim_value") or dim.dim_value < 0


def graph_mismatches(path: Path, spec: ModelSpec, exact: bool = False) -> list[str]:
    """Differences between the graph's tensors and the spec's ([batch, *dims], batch dynamic).

    Names (in order), dtypes and ranks must agree and the batch axis must be dynamic. With
    ``exact`` (the project's own exports, whose dims are declared) every dim must equal the spec's;
    otherwise (a user's file) a symbolic dim matches any spec dim, and the real shapes are checked
    by running the graph (``check_file``).
    """
    inputs, outputs = graph_tensors(path)
    problems = []
    for kind, got, want in (("input", inputs, spec.inputs), ("output", outputs, spec.outputs)):
        expected = [TensorSpec(t.name, t.dtype, (-1, *t.dims)) for t in want]
        if [t.name for t in got] != [t.name for t in expected]:
            problems.append(f"{kind}s: graph has {_show(got)}, model.toml says {_show(expected)}")
            continue
        for graph, toml in zip(got, expected):
            problem = _tensor_mismatch(graph, toml, exact)
            if problem:
                problems.append(
                    f"{kind} {graph.name}: {problem} (graph has {_show([graph])}, model.toml says {_show([toml])})"
                )
    return problems


def _tensor_mismatch(graph: TensorSpec, toml: TensorSpec, exact: bool) -> str | None:
    if graph.dtype != toml.dtype:
        return "dtype differs"
    if len(graph.dims) != len(toml.dims):
        return f"rank differs: graph {len(graph.dims)} dims, model.toml {len(toml.dims)} (batch axis included)"
    if graph.dims[0] != -1:
        return f"the batch axis (dim 0) is fixed at {graph.dims[0]}; it must be dynamic"
    differ = [i for i, (g, t) in enumerate(zip(graph.dims, toml.dims)) if g != t and (exact or g != -1)]
    if differ:
        return "dims differ at " + ", ".join(f"dim {i}" for i in differ)
    return None


def _show(tensors: list[TensorSpec]) -> str:
    return ", ".join(f"{t.name} {t.dtype} {list(t.dims)}" for t in tensors) or "none"


def dynamic_axes(spec: ModelSpec) -> dict[str, dict[int, str]]:
    """The batch axis of every tensor, and each -1 of the spec's dims (a text's tokens) as ``sequence``."""
    return {
        t.name: {0: "batch", **{i + 1: "sequence" for i, d in enumerate(t.dims) if d < 0}}
        for t in (*spec.inputs, *spec.outputs)
    }


def export(module, spec: ModelSpec, sample: dict[str, np.ndarray], path: Path) -> None:
    import torch

    args = tuple(torch.from_numpy(sample[t.name]) for t in spec.inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # The exporter's deprecation notes and the tracer's notes on shapes it fixes (the spec's
        # dims are fixed; the batch axis is declared dynamic below and checked at batch 2).
        for category in (DeprecationWarning, FutureWarning, UserWarning, torch.jit.TracerWarning):
            warnings.simplefilter("ignore", category)
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamic_axes=dynamic_axes(spec),
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    declare_output_shapes(path, spec)


def declare_output_shapes(path: Path, spec: ModelSpec, destination: Path | None = None) -> None:
    """Write the spec's dims into outputs whose dims the graph leaves symbolic.

    Reshapes computed from traced shapes (YOLOv5's Detect) leave every output dim symbolic, and so
    do many users' exports (``[-1, -1, -1]``, or names such as ``anchors``); the spec's dims are
    declared instead, with the batch dim named ``batch``, so that the file agrees with config.pbtxt
    (Triton's onnxruntime backend compares an output's dims with the config exactly: a model dim -1
    does not match a config dim 85). ``check``/``check_file`` verify that ONNX Runtime's outputs
    really have these shapes. Writes ``destination`` (default: ``path`` itself).
    """
    import onnx

    model = onnx.load(str(path))
    for value, tensor in zip(model.graph.output, spec.outputs):
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(tensor.dims) + 1:
            continue
        dims[0].Clear()
        dims[0].dim_param = "batch"
        for dim, size in zip(list(dims)[1:], tensor.dims):
            if _symbolic(dim) and size >= 0:  # a dim the spec leaves open (-1) stays symbolic
                dim.Clear()
                dim.dim_value = size
    onnx.save(model, str(destination or path))


def _outputs_symbolic(path: Path) -> bool:
    """Whether an output of the graph has a symbolic dim besides its batch axis."""
    _, outputs = graph_tensors(path)
    return any(-1 in t.dims[1:] for t in outputs)


def run_onnxruntime(path: Path, spec: ModelSpec, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([t.name for t in spec.outputs], {t.name: inputs[t.name] for t in spec.inputs})


def check(path: Path, spec: ModelSpec, recipe, module, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """onnx.checker, the graph's tensors against the spec, and ONNX Runtime against torch."""
    import onnx

    onnx.checker.check_model(str(path))
    problems = graph_mismatches(path, spec, exact=True)
    if problems:
        raise ExportError(f"[{spec.name}] the ONNX graph does not match model.toml: " + "; ".join(problems))
    inputs = recipe.sample_inputs(spec, CHECK_BATCH, np.random.default_rng(seed))
    outputs = run_onnxruntime(path, spec, inputs)
    for tensor, array in zip(spec.outputs, outputs):
        if not _shape_agrees(array.shape, (CHECK_BATCH, *tensor.dims)):
            raise ExportError(
                f"[{spec.name}] ONNX Runtime gives {tensor.name} the shape {list(array.shape)}, "
                f"model.toml says {[CHECK_BATCH, *tensor.dims]}"
            )
    compared = recipe.compare(module, spec, inputs, outputs, recipe.tolerance)
    diffs = {name: diff for name, (diff, _) in compared.items()}
    limits = {name: limit for name, (_, limit) in compared.items()}
    failed = [f"{n}: {diffs[n]:.3g} > {limits[n]:.3g}" for n in diffs if not diffs[n] <= limits[n]]
    if failed:
        raise ExportError(f"[{spec.name}] ONNX Runtime differs from torch beyond the tolerance: " + "; ".join(failed))
    return diffs, limits


def _shape_agrees(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """An output's shape against the spec's (a -1 takes any size: a text model's sequence axis)."""
    return len(shape) == len(expected) and all(want in (-1, got) for got, want in zip(shape, expected))


def sample_inputs(spec: ModelSpec, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs of the spec's dtypes and dims: floats in [-1, 1), integers in [0, 100)."""
    arrays = {}
    for tensor in spec.inputs:
        shape = (batch, *tensor.dims)
        if np.issubdtype(tensor.numpy_dtype, np.floating):
            arrays[tensor.name] = rng.uniform(-1, 1, shape).astype(tensor.numpy_dtype)
        elif tensor.numpy_dtype == np.bool_:
            arrays[tensor.name] = np.ones(shape, dtype=np.bool_)
        else:
            arrays[tensor.name] = rng.integers(0, 100, shape).astype(tensor.numpy_dtype)
    return arrays


def check_file(path: Path, spec: ModelSpec, seed: int, cache_dir: Path | None = None) -> ExportResult:
    """A user's ONNX file: onnx.checker, the graph's tensors against the spec, and ONNX Runtime at
    batch CHECK_BATCH giving the spec's output shapes (no framework model to compare with).

    The graph's declared tensors must agree in names, dtypes and ranks, with a dynamic batch axis;
    a symbolic dim (``-1``, a name) matches the spec's, since the run at batch CHECK_BATCH is what
    checks the real shapes. A file whose outputs have symbolic dims is served as a copy with the
    spec's dims declared (``declare_output_shapes``): ``<cache_dir>/onnx/<model>/declared-<sha>/``
    (``cache_dir`` defaults to build/). The result's path is the file to serve.
    """
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, onnx.onnx_cpp2py_export.shape_inference.InferenceError) as error:
        raise ExportError(f"[{spec.name}] {path} fails onnx.checker: {error}") from None
    problems = graph_mismatches(path, spec)
    if problems:
        raise ExportError(f"[{spec.name}] {path} does not match model.toml: " + "; ".join(problems))
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    refusals = (
        RuntimeError,
        ort_errors.Fail,
        ort_errors.InvalidArgument,
        ort_errors.InvalidGraph,
        ort_errors.NotImplemented,
        ort_errors.RuntimeException,
    )
    try:
        outputs = run_onnxruntime(path, spec, sample_inputs(spec, CHECK_BATCH, np.random.default_rng(seed)))
    except refusals as error:
        raise ExportError(f"[{spec.name}] ONNX Runtime cannot run {path} at batch {CHECK_BATCH}: {error}") from None
    for tensor, array in zip(spec.outputs, outputs):
        if not _shape_agrees(array.shape, (CHECK_BATCH, *tensor.dims)) or array.dtype != tensor.numpy_dtype:
            raise ExportError(
                f"[{spec.name}] ONNX Runtime gives {tensor.name} {array.dtype} {list(array.shape)}, "
                f"model.toml says {tensor.dtype} {[CHECK_BATCH, *tensor.dims]}"
            )
    sha256 = sha256_of(path)
    if not _outputs_symbolic(path):
        return ExportResult(path, sha256, {}, {}, cached=False)
    folder = Path(cache_dir or _default_cache_dir()) / "onnx" / spec.name / f"declared-{sha256[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "partial.onnx"
    declare_output_shapes(path, spec, partial)
    served = partial.replace(folder / ONNX_FILE)
    return ExportResult(served, sha256_of(served), {}, {}, cached=False)


def _default_cache_dir() -> Path:
    from scripts.model_prep.arguments import BUILD_DIR

    return BUILD_DIR


def cached(folder: Path, spec: ModelSpec) -> ExportResult | None:
    """A previous export of the same model and weights, if complete and still matching the spec."""
    path, report_path = folder / ONNX_FILE, folder / REPORT_FILE
    if not (path.is_file() and report_path.is_file()):
        return None
    report = json.loads(report_path.read_text())
    if report.get("opset") != OPSET or graph_mismatches(path, spec, exact=True):
        return None
    return ExportResult(path, report["onnx_sha256"], report["max_abs_diff"], report["tolerance"], cached=True)


def save_report(folder: Path, result: ExportResult, weights: dict) -> None:
    report = {
        "opset": OPSET,
        "onnx_sha256": result.sha256,
        "max_abs_diff": result.max_abs_diff,
        "tolerance": result.tolerance,
        "weights": weights,
    }
    (folder / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
