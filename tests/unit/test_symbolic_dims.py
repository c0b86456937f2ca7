"""A user's ONNX file whose output dims are symbolic ([-1, -1, -1], or names such as 'anchors'):
accepted where model.toml gives concrete dims, checked by ONNX Runtime's run at batch 2, and
served as a copy with model.toml's dims declared (Triton's onnxruntime backend compares an
output's dims with config.pbtxt exactly)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.core.spec import TensorSpec
from clients.families import load_spec
from scripts.model_prep import onnx_export
from scripts.model_prep.onnx_export import ExportError, check_file, graph_mismatches, graph_tensors

INPUT_DIMS = ["batch", 3, 64, 64]


def tiny_detector(path: Path, output_dims: list, input_dims: list = INPUT_DIMS, dynamic_size: bool = False) -> Path:
    """images FP32 [N, 3, 64, 64] -> output FP32 [N, 12, 85] (a Reshape and a Slice of the pixels),
    the output declared with ``output_dims``. With ``dynamic_size`` the input is declared
    [batch, 3, height, width] and the Reshape's anchor count left to it (``ultralytics``'
    ``dynamic=True`` exports look so): even ONNX Runtime's shape inference cannot tell that dim."""
    shape = [0, -1, 1024] if dynamic_size else [-1, 12, 1024]
    initializers = [
        numpy_helper.from_array(np.array(shape, np.int64), "shape"),
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([85], np.int64), "ends"),
        numpy_helper.from_array(np.array([2], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Reshape", ["images", "shape"], ["rows"]),
        helper.make_node("Slice", ["rows", "starts", "ends", "axes"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_detector",
        [
            helper.make_tensor_value_info(
                "images", TensorProto.FLOAT, ["batch", 3, "height", "width"] if dynamic_size else input_dims
            )
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, output_dims)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def detector_spec(folder: Path, output_dims: list[int], input_dims: list[int] = (3, 64, 64)):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.toml").write_text(f"""
family = "detection"
max_batch_size = 4

[[inputs]]
name = "images"
dtype = "FP32"
dims = {list(input_dims)}

[[outputs]]
name = "output"
dtype = "FP32"
dims = {list(output_dims)}

[export]
onnx = "model.onnx"
""")
    return load_spec(folder)


def declared_dims(path: Path) -> list:
    return [d.dim_param or d.dim_value for d in onnx.load(str(path)).graph.output[0].type.tensor_type.shape.dim]


@pytest.mark.parametrize(
    "output_dims",
    [
        [-1, -1, -1],
        ["batch", "anchors", "85"],  # named dims (dim_param) are symbolic too, whatever their names say
        [None, None, None],  # dims with neither a value nor a name
        ["batch", -1, 85],  # partly symbolic
    ],
    ids=["minus-one", "named", "unset", "mixed"],
)
@pytest.mark.parametrize("dynamic_size", [False, True], ids=["fixed-size", "dynamic-size"])
def test_symbolic_output_dims_are_accepted_when_onnx_runtime_gives_the_spec_shape(tmp_path, output_dims, dynamic_size):
    spec = detector_spec(tmp_path / "tiny", [12, 85])
    path = tiny_detector(spec.folder / "model.onnx", output_dims, dynamic_size=dynamic_size)
    original = path.read_bytes()

    assert graph_mismatches(path, spec) == []
    result = check_file(path, spec, seed=0, cache_dir=tmp_path / "cache")

    # served: a copy with model.toml's dims declared; the user's file is left as it was
    assert result.path != path and result.path.is_relative_to(tmp_path / "cache" / "onnx" / "tiny")
    assert path.read_bytes() == original
    assert declared_dims(result.path) == ["batch", 12, 85]
    assert graph_tensors(result.path)[1] == [TensorSpec("output", "FP32", (-1, 12, 85))]
    assert graph_tensors(result.path)[0] == graph_tensors(path)[0]  # inputs as they were (-1 matches there)
    assert result.sha256 == onnx_export.sha256_of(result.path)
    pixels = np.random.default_rng(0).uniform(0, 1, (3, 3, 64, 64)).astype(np.float32)
    (served,) = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"]).run(None, {"images": pixels})
    (given,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"images": pixels})
    assert served.shape == (3, 12, 85)
    np.testing.assert_array_equal(served, given)

    # what Triton's onnxruntime backend compares with config.pbtxt's dims (exactly, for outputs)
    def session_dims(onnx_path: Path) -> list:
        return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).get_outputs()[0].shape

    assert session_dims(result.path) == ["batch", 12, 85]
    if dynamic_size:  # the user's file alone would not do there: ONNX Runtime cannot tell the anchors
        assert session_dims(path)[1] in (None, "anchors")


def test_concrete_output_dims_are_served_as_the_users_file(tmp_path):
    spec = detector_spec(tmp_path / "tiny", [12, 85])
    path = tiny_detector(spec.folder / "model.onnx", ["batch", 12, 85])
    result = check_file(path, spec, seed=0, cache_dir=tmp_path / "cache")
    assert result.path == path and result.sha256 == onnx_export.sha256_of(path)
    assert not (tmp_path / "cache").exists()


def test_symbolic_input_dims_match_and_are_left_symbolic(tmp_path):
    spec = detector_spec(tmp_path / "tiny", [12, 85])
    path = tiny_detector(spec.folder / "model.onnx", ["batch", 12, 85], input_dims=["batch", 3, "height", "width"])
    assert graph_tensors(path)[0][0].dims == (-1, 3, -1, -1)
    assert check_file(path, spec, seed=0, cache_dir=tmp_path / "cache").path == path


@pytest.mark.parametrize("dynamic_size", [False, True], ids=["fixed-size", "dynamic-size"])
def test_symbolic_dims_that_onnx_runtime_contradicts_are_refused(tmp_path, dynamic_size):
    spec = detector_spec(tmp_path / "tiny", [10, 85])  # the graph really gives [N, 12, 85]
    path = tiny_detector(spec.folder / "model.onnx", [-1, -1, -1], dynamic_size=dynamic_size)
    assert graph_mismatches(path, spec) == []  # the declared dims say nothing against it ...
    with pytest.raises(ExportError) as refused:  # ... the run at batch 2 does
        check_file(path, spec, seed=0, cache_dir=tmp_path / "cache")
    message = str(refused.value)
    assert message.startswith("[tiny] ONNX Runtime gives output float32 [2, 12, 85], model.toml says FP32 [2, 10, 85]")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("output_dims", "problem"),
    [
        (
            [-1, -1],
            (
                "output output: rank differs: graph 2 dims, model.toml 3 (batch axis included) "
                "(graph has output FP32 [-1, -1], model.toml says output FP32 [-1, 12, 85])"
            ),
        ),
        ([-1, -1, -1, -1], "output output: rank differs: graph 4 dims, model.toml 3"),
        (
            [-1, 10, 85],
            (
                "output output: dims differ at dim 1 (graph has output FP32 [-1, 10, 85], "
                "model.toml says output FP32 [-1, 12, 85])"
            ),
        ),
        (["batch", "anchors", 80], "output output: dims differ at dim 2"),
        ([2, -1, -1], "output output: the batch axis (dim 0) is fixed at 2; it must be dynamic"),
    ],
    ids=["rank-2", "rank-4", "concrete-dim", "concrete-dim-beside-names", "fixed-batch"],
)
def test_declared_dims_that_contradict_model_toml_are_refused(tmp_path, output_dims, problem):
    spec = detector_spec(tmp_path / "tiny", [12, 85])
    path = tiny_detector(spec.folder / "model.onnx", output_dims)
    problems = graph_mismatches(path, spec)
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    with pytest.raises(ExportError, match=r"^\[tiny\] .*model\.onnx does not match model\.toml: output output: "):
        check_file(path, spec, seed=0, cache_dir=tmp_path / "cache")


def test_names_and_dtypes_must_still_agree(tmp_path):
    spec = detector_spec(tmp_path / "tiny", [12, 85])
    path = tiny_detector(spec.folder / "model.onnx", [-1, -1, -1])
    model = onnx.load(str(path))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.save(model, str(tmp_path / "fp16.onnx"))
    assert graph_mismatches(tmp_path / "fp16.onnx", spec) == [
        "output output: dtype differs (graph has output FP16 [-1, -1, -1], model.toml says output FP32 [-1, 12, 85])"
    ]

    renamed = detector_spec(tmp_path / "renamed", [12, 85])
    (renamed.folder / "model.toml").write_text(
        (renamed.folder / "model.toml").read_text().replace('name = "output"', 'name = "boxes"')
    )
    renamed = load_spec(renamed.folder)
    assert graph_mismatches(path, renamed) == [
        "outputs: graph has output FP32 [-1, -1, -1], model.toml says boxes FP32 [-1, 12, 85]"
    ]


def test_exact_matching_still_refuses_symbolic_dims(tmp_path):
    """The project's own exports (``check``) and the export cache (``cached``) compare exactly:
    their files are the ones Triton loads, with the spec's dims declared."""
    spec = detector_spec(tmp_path / "tiny", [12, 85])
    path = tiny_detector(spec.folder / "model.onnx", [-1, -1, -1])
    assert graph_mismatches(path, spec, exact=True) == [
        (
            "output output: dims differ at dim 1, dim 2 (graph has output FP32 [-1, -1, -1], "
            "model.toml says output FP32 [-1, 12, 85])"
        )
    ]

    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(path.read_bytes())
    onnx_export.save_report(folder, onnx_export.ExportResult(folder / "model.onnx", "x", {}, {}, False), {})
    assert onnx_export.cached(folder, spec) is None
    onnx_export.declare_output_shapes(folder / "model.onnx", spec)
    hit = onnx_export.cached(folder, spec)
    assert hit is not None and hit.cached and declared_dims(hit.path) == ["batch", 12, 85]
