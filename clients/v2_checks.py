"""A KServe v2 request checked against the model it names, before Triton sees it.

Triton trusts what a request declares: a v2 JSON input whose ``shape`` is ``[1, 1000000000000]``
with a short ``data`` makes it allocate for the shape, throw ``std::bad_alloc`` and abort, taking
every model of the endpoint down (its issues #2643, #3119, #3563, #3916, #5664 are more of the
kind). So the router passes no v2 body on before this module has compared its JSON header with the
model's own configuration (``ModelContract.from_config``, read from Triton once per model and load):

- every input is one of the model's, given once, and every required one is given;
- its ``datatype`` is the config's, its rank and every dimension are the config's (a -1 takes any
  size from 1 up; the batch dimension 1 to ``max_batch_size``, the same for every input);
- its elements are what its data holds: JSON ``data`` (nested or flat) counted and its values'
  types looked at, or ``binary_data_size`` equal to elements x the datatype's size (BYTES walked by
  their 4-byte length prefixes), and the binary sizes add up to what follows the JSON header;
- the requested outputs are the model's; the declared tensor bytes are within MAX_BODY_BYTES.

Whatever fails is an ``InvalidInput`` (400) naming the input and what differs. Nothing is decoded
or copied: the check reads the parsed header and, for BYTES only, the length prefixes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import InvalidInput
from app.core.settings import BODY_LIMIT
from app.core.spec import TRITON_TO_NUMPY

BINARY_JSON_TYPE = "application/vnd.sagemaker-triton.binary+json"
# Bytes per element of each v2 datatype: the numpy twins' (app.core.spec's table), and the two
# without one: bfloat16, and BYTES, whose elements are a 4-byte little-endian length and the bytes.
ITEM_BYTES: Mapping[str, int] = {name: dtype.itemsize for name, dtype in TRITON_TO_NUMPY.items()} | {
    "BF16": 2,
    "BYTES": 4,
}
_CONFIG_TYPES = {f"TYPE_{name}": name for name in ITEM_BYTES} | {"TYPE_STRING": "BYTES"}
_INT_RANGES = {
    name: ((0, 2 ** (8 * size) - 1) if name.startswith("U") else (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1))
    for name, size in ITEM_BYTES.items()
    if "INT" in name
}
_NO_JSON = frozenset({"FP16", "BF16"})  # Triton takes these as binary data only
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class TensorSpec:
    """One input of a model as its config declares it (``dims`` without the batch dimension)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class ModelContract:
    """What a model takes and gives, from Triton's config of it (``GET /v2/models/<m>/config``)."""

    model: str
    max_batch_size: int
    inputs: Mapping[str, TensorSpec]
    outputs: frozenset[str]

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, Any]) -> ModelContract:
        """``config``: Triton's model configuration as JSON (its protobuf field names)."""
        inputs = {}
        for tensor in config.get("input", ()):
            datatype = _CONFIG_TYPES.get(str(tensor.get("data_type", "")))
            if datatype is None:
                raise ValueError(
                    f"model {model!r}: input {tensor.get('name')!r} has datatype {tensor.get('data_type')!r}"
                )
            inputs[tensor["name"]] = TensorSpec(
                tensor["name"],
                datatype,
                tuple(int(d) for d in tensor.get("dims", ())),
                bool(tensor.get("optional", False)),
            )
        outputs = frozenset(tensor["name"] for tensor in config.get("output", ()))
        return cls(model, int(config.get("max_batch_size", 0) or 0), inputs, outputs)

    @classmethod
    def from_pbtxt(cls, model: str, text: str) -> ModelContract:
        """From a ``config.pbtxt`` as written in a repository (the same fields as Triton's JSON)."""
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2

        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        return cls.from_config(model, json_format.MessageToDict(config, preserving_proto_field_name=True))

    def shape_of(self, spec: TensorSpec) -> tuple[int, ...]:
        """The shape a request declares for ``spec``: the batch dimension first when the model batches."""
        return (-1, *spec.dims) if self.max_batch_size > 0 else spec.dims

    def describe(self, spec: TensorSpec) -> str:
        dims = ", ".join(str(d) for d in spec.dims)
        return (
            f"{spec.datatype} [batch 1-{self.max_batch_size}, {dims}]"
            if self.max_batch_size > 0
            else f"{spec.datatype} [{dims}]"
        )


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _whole(value: Any) -> bool:
    return type(value) is int


def check_request(header: Any, contract: ModelContract, binary: bytes | memoryview | None, max_bytes: int) -> None:
    """Raise ``InvalidInput`` unless ``header`` (a v2 JSON body, or a binary+json body's JSON header)
    is a request ``contract``'s model can take; ``binary``: what follows the header (None for v2 JSON)."""
    model = contract.model
    if not isinstance(header, dict):
        raise InvalidInput(f"a KServe v2 request for {model!r} must be a JSON object, not {_kind(header)}")
    if "id" in header and not isinstance(header["id"], str):
        raise InvalidInput(f"id must be a string, got {_kind(header['id'])}")
    _check_parameters(header.get("parameters"), "parameters")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInput(
            f'inputs must be a non-empty list of tensors ({{"name", "datatype", "shape", "data"}}) '
            f"for model {model!r}, got {_kind(inputs) if not isinstance(inputs, list) else 'an empty list'}"
        )
    seen: set[str] = set()
    batch: int | None = None
    declared = offset = 0
    for index, tensor in enumerate(inputs):
        spec = _input_spec(tensor, index, contract, seen)
        where = f"input {spec.name!r} of model {model!r}"
        shape = _check_shape(tensor.get("shape"), spec, contract, where)
        if contract.max_batch_size > 0:
            if batch is not None and shape[0] != batch:
                raise InvalidInput(
                    f"{where} has a batch of {shape[0]}, the inputs before it {batch}: every input "
                    "of one request has the same batch size"
                )
            batch = shape[0]
        count = math.prod(shape)
        parameters = tensor.get("parameters")
        _check_parameters(parameters, f"{where}: parameters")
        parameters = parameters or {}
        if any(key in parameters for key in _SHARED_MEMORY):
            raise InvalidInput(f"{where} names a shared memory region: this endpoint takes tensors in the body only")
        size = parameters.get("binary_data_size")
        if (size is None) == ("data" not in tensor):
            raise InvalidInput(
                f"{where} must carry its values in exactly one of 'data' and binary data "
                "('binary_data_size' in its parameters)"
            )
        fixed = count * ITEM_BYTES[spec.datatype] if spec.datatype != "BYTES" else None
        if fixed is not None and declared + fixed > max_bytes:
            raise _too_large(where, shape, declared + fixed, max_bytes)
        if size is None:
            if fixed is None:
                declared += _json_strings_bytes(tensor["data"], count, shape, where)
                if declared > max_bytes:
                    raise _too_large(where, shape, declared, max_bytes)
            else:
                _check_json_data(tensor["data"], spec, count, shape, where)
                declared += fixed
            continue
        if binary is None:
            raise InvalidInput(
                f"{where} declares binary_data_size, but the body is v2 JSON: send binary tensors as "
                f"{BINARY_JSON_TYPE};json-header-size=N"
            )
        if not _whole(size) or size < 0:
            raise InvalidInput(f"{where}: binary_data_size must be a whole number of bytes, got {size!r}")
        if offset + size > len(binary):
            raise InvalidInput(
                f"{where} declares {size} bytes of binary data from byte {offset} after the JSON header, "
                f"but only {len(binary)} bytes follow it"
            )
        if fixed is not None and size != fixed:
            raise InvalidInput(
                f"{where} declares shape {list(shape)}: {count} elements of {spec.datatype} "
                f"({ITEM_BYTES[spec.datatype]} bytes each) are {fixed} bytes, but binary_data_size is {size}"
            )
        if fixed is None:
            _check_binary_strings(binary, offset, size, count, shape, where)
        declared, offset = declared + size, offset + size
        if declared > max_bytes:
            raise _too_large(where, shape, declared, max_bytes)
    missing = [name for name, spec in contract.inputs.items() if not spec.optional and name not in seen]
    if missing:
        raise InvalidInput(
            f"model {model!r} needs input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}, "
            "which the request does not give"
        )
    if binary is not None and offset != len(binary):
        raise InvalidInput(
            f"{len(binary)} bytes follow the JSON header, but the inputs' binary_data_size add up to {offset}"
        )
    _check_outputs(header.get("outputs"), contract)


def _too_large(where: str, shape: Sequence[int], total: int, max_bytes: int) -> InvalidInput:
    return InvalidInput(
        f"{where} declares shape {list(shape)}, which brings the request's tensors to {total} bytes, "
        f"over the {max_bytes} bytes {BODY_LIMIT} allows"
    )


def _input_spec(tensor: Any, index: int, contract: ModelContract, seen: set[str]) -> TensorSpec:
    if not isinstance(tensor, dict):
        raise InvalidInput(f"inputs[{index}] must be a JSON object (a tensor), not {_kind(tensor)}")
    name = tensor.get("name")
    if not isinstance(name, str):
        raise InvalidInput(f"inputs[{index}].name must be a string, got {_kind(name)}")
    spec = contract.inputs.get(name)
    if spec is None:
        takes = ", ".join(f"{n!r} ({contract.describe(s)})" for n, s in contract.inputs.items())
        raise InvalidInput(f"input {name!r} is not an input of model {contract.model!r}; it takes {takes}")
    if name in seen:
        raise InvalidInput(f"input {name!r} is given twice")
    seen.add(name)
    datatype = tensor.get("datatype")
    if datatype != spec.datatype:
        raise InvalidInput(f"input {name!r} of model {contract.model!r} is {spec.datatype}, not {datatype!r}")
    return spec


def _check_shape(shape: Any, spec: TensorSpec, contract: ModelContract, where: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise InvalidInput(f"{where}: shape must be a list of whole numbers, got {shape!r}"[:300])
    expected = contract.shape_of(spec)
    if len(shape) != len(expected):
        raise InvalidInput(
            f"{where} has {len(expected)} dimensions ({contract.describe(spec)}), "
            f"the request declares {len(shape)}: {shape}"[:300]
        )
    for axis, (got, want) in enumerate(zip(shape, expected)):
        if got < 1:
            raise InvalidInput(f"{where}: dimension {axis} of shape {shape} is {got}; every dimension is 1 or more")
        if axis == 0 and contract.max_batch_size > 0:
            if got > contract.max_batch_size:
                raise InvalidInput(
                    f"{where}: a batch of {got} is over the model's max_batch_size "
                    f"{contract.max_batch_size} (shape {shape})"
                )
        elif want != -1 and got != want:
            raise InvalidInput(
                f"{where}: dimension {axis} of shape {shape} is {got}, the model's is {want} "
                f"({contract.describe(spec)})"
            )
    return tuple(shape)


def _check_parameters(parameters: Any, where: str) -> None:
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{where} must be a JSON object, not {_kind(parameters)}")
    for key, value in parameters.items():
        if not isinstance(value, _SCALARS) or (_whole(value) and not -(2**63) <= value < 2**64):
            raise InvalidInput(f"{where}: {key!r} must be a string, a number or a boolean, got {value!r}"[:300])


def _leaves(data: Any) -> list[Any]:
    """The values of (nested) JSON ``data``, in no particular order."""
    if type(data) is not list:
        return [data]
    if not any(type(item) is list for item in data):
        return data
    found: list[Any] = []
    todo = [data]
    while todo:
        for item in todo.pop():
            (todo if type(item) is list else found).append(item)
    return found


def _count_leaves(data: Any, count: int, shape: Sequence[int], where: str) -> list[Any]:
    values = _leaves(data)
    if len(values) != count:
        raise InvalidInput(f"{where} declares shape {list(shape)} ({count} elements), but its data holds {len(values)}")
    return values


def _check_json_data(data: Any, spec: TensorSpec, count: int, shape: Sequence[int], where: str) -> None:
    if spec.datatype in _NO_JSON:
        raise InvalidInput(
            f"{where} is {spec.datatype}, which travels as binary data only: send "
            f"{BINARY_JSON_TYPE};json-header-size=N with binary_data_size"
        )
    values = _count_leaves(data, count, shape, where)
    if spec.datatype == "BOOL":
        if not all(type(v) is bool for v in values):
            bad = next(v for v in values if type(v) is not bool)
            raise InvalidInput(f"{where} is BOOL: its data must be true or false, found {bad!r}"[:300])
        return
    if spec.datatype.startswith("FP"):
        if not all(type(v) is float or type(v) is int for v in values):
            bad = next(v for v in values if not (type(v) is float or type(v) is int))
            raise InvalidInput(
                f"{where} is {spec.datatype}: its data must be numbers, found {bad!r} ({_kind(bad)})"[:300]
            )
        return
    low, high = _INT_RANGES[spec.datatype]
    if not all(type(v) is int for v in values):
        bad = next(v for v in values if type(v) is not int)
        raise InvalidInput(
            f"{where} is {spec.datatype}: its data must be whole numbers, found {bad!r} ({_kind(bad)})"[:300]
        )
    if min(values) < low or max(values) > high:
        bad = min(values) if min(values) < low else max(values)
        raise InvalidInput(f"{where} is {spec.datatype}: {bad} is outside [{low}, {high}]")


def _json_strings_bytes(data: Any, count: int, shape: Sequence[int], where: str) -> int:
    """A BYTES input's JSON data checked (strings only): the bytes Triton lays it out in."""
    values = _count_leaves(data, count, shape, where)
    if not all(type(v) is str for v in values):
        bad = next(v for v in values if type(v) is not str)
        raise InvalidInput(f"{where} is BYTES: its data must be strings, found {bad!r} ({_kind(bad)})"[:300])
    return sum(len(v.encode("utf-8", "surrogatepass")) + 4 for v in values)


def _check_binary_strings(
    binary: bytes | memoryview, start: int, size: int, count: int, shape: Sequence[int], where: str
) -> None:
    """A BYTES input's binary data: ``count`` elements, each a 4-byte little-endian length and as many bytes."""
    end, position, found = start + size, start, 0
    while position < end:
        if position + 4 > end:
            raise InvalidInput(f"{where}: its binary data ends inside the length of element {found}")
        position += 4 + int.from_bytes(binary[position : position + 4], "little")
        found += 1
        if position > end or found > count:
            break
    if position != end or found != count:
        raise InvalidInput(
            f"{where} declares shape {list(shape)} ({count} elements), but its {size} bytes of binary "
            f"data do not hold exactly {count} length-prefixed elements"
        )


def _check_outputs(outputs: Any, contract: ModelContract) -> None:
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise InvalidInput(f'outputs must be a list of {{"name"}} objects, not {_kind(outputs)}')
    seen: set[str] = set()
    for index, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str):
            raise InvalidInput(f"outputs[{index}] must be an object with a string name, got {output!r}"[:300])
        if name not in contract.outputs:
            raise InvalidInput(
                f"output {name!r} is not an output of model {contract.model!r}; "
                f"its outputs: {', '.join(sorted(contract.outputs))}"
            )
        if name in seen:
            raise InvalidInput(f"output {name!r} is asked for twice")
        seen.add(name)
        parameters = output.get("parameters")
        where = f"output {name!r}: parameters"
        _check_parameters(parameters, where)
        parameters = parameters or {}
        if any(key in parameters for key in _SHARED_MEMORY):
            raise InvalidInput(f"output {name!r} names a shared memory region: this endpoint answers in the body only")
        if "binary_data" in parameters and type(parameters["binary_data"]) is not bool:
            raise InvalidInput(f"{where}: binary_data must be true or false")
        classes = parameters.get("classification")
        if classes is not None and (not _whole(classes) or classes < 0):
            raise InvalidInput(f"{where}: classification must be a whole number of classes, got {classes!r}")
