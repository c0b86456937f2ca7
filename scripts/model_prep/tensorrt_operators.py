"""The ONNX operators TensorRT's ONNX parser imports, and the restrictions our graphs must keep.

Source: onnx/onnx-tensorrt ``docs/operators.md`` at tag ``release/10.1-GA`` (commit 96e7811), the
operators marked ``Y``; its ``docs/Changelog.md`` for 10.2 to 10.8 (the TensorRT of the NGC Triton
25.02 image the Dockerfile names) only adds support (tensor ``axes`` for Slice and Pad, dynamic
axes for Squeeze, Unsqueeze and CumSum, ...), so every operator here is imported by 10.8 too.
docs/deploying.md, "TensorRT engines and the GPU type", cites the same list.
"""

from __future__ import annotations

from collections.abc import Iterable

TENSORRT_OPERATORS = frozenset(
    [
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "And",
        "ArgMax",
        "ArgMin",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "CastLike",
        "Ceil",
        "Celu",
        "Clip",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Conv",
        "ConvTranspose",
        "Cos",
        "Cosh",
        "CumSum",
        "DeformConv",
        "DepthToSpace",
        "DequantizeLinear",
        "Div",
        "Dropout",
        "Einsum",
        "Elu",
        "Equal",
        "Erf",
        "Exp",
        "Expand",
        "EyeLike",
        "Flatten",
        "Floor",
        "Gather",
        "GatherElements",
        "GatherND",
        "Gelu",
        "Gemm",
        "GlobalAveragePool",
        "GlobalLpPool",
        "GlobalMaxPool",
        "Greater",
        "GreaterOrEqual",
        "GridSample",
        "GroupNormalization",
        "GRU",
        "HardSigmoid",
        "HardSwish",
        "Hardmax",
        "Identity",
        "If",
        "ImageScaler",
        "InstanceNormalization",
        "IsInf",
        "IsNaN",
        "LayerNormalization",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "LogSoftmax",
        "Loop",
        "LRN",
        "LSTM",
        "LpNormalization",
        "LpPool",
        "MatMul",
        "Max",
        "MaxPool",
        "Mean",
        "MeanVarianceNormalization",
        "Min",
        "Mish",
        "Mod",
        "Mul",
        "Neg",
        "NonMaxSuppression",
        "NonZero",
        "Not",
        "OneHot",
        "Or",
        "Pad",
        "ParametricSoftplus",
        "Pow",
        "PRelu",
        "QuantizeLinear",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Range",
        "Reciprocal",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
        "Relu",
        "Reshape",
        "Resize",
        "ReverseSequence",
        "RNN",
        "RoiAlign",
        "Round",
        "ScaledTanh",
        "Scan",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Selu",
        "Shape",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Size",
        "Slice",
        "Softmax",
        "Softplus",
        "Softsign",
        "SpaceToDepth",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Sum",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
        "Tile",
        "TopK",
        "Transpose",
        "Trilu",
        "Unsqueeze",
        "Upsample",
        "Where",
        "Xor",
    ]
)

# Restrictions of that list on operators our graphs use: these inputs must be initializers.
CONSTANT_INPUTS = {
    "Slice": (3,),  # axes
    "Squeeze": (1,),  # axes
    "Unsqueeze": (1,),  # axes
    "ReduceSum": (1,),  # axes
    "ReduceMax": (1,),  # axes (an input from opset 18)
}
TOPK_LIMIT = 3840  # "K input must be less than 3840"; and "sorted must be 1"


def problems(model) -> list[str]:
    """What in an ONNX model TensorRT's parser would refuse, by that list (nothing when it imports)."""
    constants = {init.name: init for init in model.graph.initializer}
    constants.update({node.output[0]: node for node in model.graph.node if node.op_type == "Constant"})
    found = []
    for node in _nodes(model.graph.node):
        where = f"{node.op_type} {node.name or node.output[0]}"
        if node.op_type not in TENSORRT_OPERATORS:
            found.append(f"{where}: not an operator TensorRT imports")
        for index in CONSTANT_INPUTS.get(node.op_type, ()):
            if index < len(node.input) and node.input[index] and node.input[index] not in constants:
                found.append(f"{where}: input {index} ({node.input[index]}) is not an initializer")
        if node.op_type == "TopK":
            if any(a.name == "sorted" and a.i == 0 for a in node.attribute):
                found.append(f"{where}: sorted must be 1")
            k = constants.get(node.input[1])
            if k is not None and hasattr(k, "dims") and _value(k) >= TOPK_LIMIT:
                found.append(f"{where}: K {_value(k)} is not under {TOPK_LIMIT}")
    return found


def operators(model) -> list[str]:
    """The graph's operator types (subgraphs included), sorted."""
    return sorted({node.op_type for node in _nodes(model.graph.node)})


def _nodes(nodes: Iterable) -> Iterable:
    for node in nodes:
        yield node
        for attribute in node.attribute:
            if attribute.g.node:
                yield from _nodes(attribute.g.node)


def _value(tensor) -> int:
    from onnx import numpy_helper

    return int(numpy_helper.to_array(tensor).reshape(-1)[0])
