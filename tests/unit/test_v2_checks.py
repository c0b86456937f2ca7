"""KServe v2 bodies checked against the model's config before Triton sees them, and how a v2 body is
recognised. The media types a body may have and Triton's refusals mapped to the router's errors:
``test_v2_media_and_refusals.py``."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton

from app.core.errors import InvalidInput
from app.core.spec import TRITON_TO_NUMPY
from app.router.parsing import is_v2
from clients.v2_checks import BINARY_JSON_TYPE, ITEM_BYTES, ModelContract, check_request

MAX = 6 * 2**20
BERT = ModelContract.from_config(
    "bert_base",
    {
        "name": "bert_base",
        "max_batch_size": 8,
        "input": [
            {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [128]},
            {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [128]},
        ],
        "output": [
            {"name": "scores", "data_type": "TYPE_FP32", "dims": [128, 50]},
            {"name": "pooled", "data_type": "TYPE_FP32", "dims": [768]},
        ],
    },
)
PREPROCESS = ModelContract.from_config(
    "preprocess",
    {
        "name": "preprocess",
        "max_batch_size": 16,
        "input": [
            {"name": "image", "data_type": "TYPE_UINT8", "dims": [-1]},
            {"name": "size", "data_type": "TYPE_INT64", "dims": [1]},
            {"name": "mean", "data_type": "TYPE_FP32", "dims": [3], "optional": True},
        ],
        "output": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
    },
)
TAGGER = ModelContract.from_config(
    "tagger",
    {  # no batching: shapes are the dims as they are
        "name": "tagger",
        "max_batch_size": 0,
        "input": [
            {"name": "text", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "scale", "data_type": "TYPE_FP16", "dims": [2], "optional": True},
            {"name": "shift", "data_type": "TYPE_INT8", "dims": [1], "optional": True},
        ],
        "output": [{"name": "tags", "data_type": "TYPE_INT64", "dims": [-1]}],
    },
)
PREPROCESS_PBTXT = """
name: "preprocess"
max_batch_size: 16
input [
  { name: "image" data_type: TYPE_UINT8 dims: [ -1 ] },
  { name: "size" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "mean" data_type: TYPE_FP32 dims: [ 3 ] optional: true }
]
output [ { name: "pixels" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def tensor(name, datatype, shape, data=None, **parameters):
    found = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        found["data"] = data
    if parameters:
        found["parameters"] = parameters
    return found


IDS = tensor("input_ids", "INT64", [1, 128], list(range(128)))
MASK = tensor("attention_mask", "INT64", [1, 128], [1] * 128)
SIZE = tensor("size", "INT64", [1, 1], [224])
TEXT = tensor("text", "BYTES", [2], ["a", "b"])


def ids(data, shape=(1, 128)):
    return tensor("input_ids", "INT64", list(shape), data)


def strings(*items):
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def v2_body(inputs, outputs=()):
    """(header, binary) as tritonclient lays a binary+json body out."""
    body, json_size = triton.InferenceServerClient.generate_request_body(
        inputs, outputs=[triton.InferRequestedOutput(name, binary_data=True) for name in outputs] or None
    )
    json_size = json_size or len(body)
    return json.loads(body[:json_size]), memoryview(body)[json_size:]


def infer_input(name, array, datatype, binary=True):
    found = triton.InferInput(name, list(array.shape), datatype)
    found.set_data_from_numpy(array, binary_data=binary)
    return found


def test_contracts_from_configs():
    assert BERT.max_batch_size == 8 and BERT.outputs == {"scores", "pooled"}
    assert BERT.inputs["input_ids"].dims == (128,) and BERT.inputs["input_ids"].datatype == "INT64"
    assert PREPROCESS.inputs["image"].dims == (-1,) and PREPROCESS.inputs["mean"].optional
    assert TAGGER.max_batch_size == 0
    assert (TAGGER.inputs["text"].datatype, TAGGER.inputs["scale"].datatype) == ("BYTES", "FP16")
    assert (BERT.shape_of(BERT.inputs["input_ids"]), TAGGER.shape_of(TAGGER.inputs["text"])) == ((-1, 128), (-1,))


def test_the_datatypes_are_the_one_tables_and_tritons():
    """ITEM_BYTES comes from app.core.spec's table, which holds every datatype Triton's client gives a
    numpy twin of its own; BF16 (carried as float32 there) and BYTES are the two added."""
    from tritonclient.utils import triton_to_np_dtype

    assert set(ITEM_BYTES) == {*TRITON_TO_NUMPY, "BF16", "BYTES"}
    for name, dtype in TRITON_TO_NUMPY.items():
        assert np.dtype(triton_to_np_dtype(name)) == dtype and ITEM_BYTES[name] == dtype.itemsize
    assert (ITEM_BYTES["BF16"], ITEM_BYTES["BYTES"]) == (2, 4)


def test_contract_from_a_real_config_pbtxt():
    """Protobuf's JSON writes int64 dims as strings, and leaves out what is at its default."""
    assert ModelContract.from_pbtxt("preprocess", PREPROCESS_PBTXT) == PREPROCESS


def test_good_requests_pass():
    nested = [list(range(128)), list(range(128))]
    for contract, header in [
        (BERT, {"inputs": [IDS, MASK], "outputs": [{"name": "scores"}], "id": "r1", "parameters": {"a": 1}}),
        (BERT, {"inputs": [ids(nested, (2, 128)), tensor("attention_mask", "INT64", [2, 128], nested)]}),
        (PREPROCESS, {"inputs": [tensor("image", "UINT8", [1, 3], [0, 128, 255]), SIZE]}),  # mean is optional
        (TAGGER, {"inputs": [tensor("text", "BYTES", [2], ["héllo", ""]), tensor("shift", "INT8", [1], [-128])]}),
    ]:
        check_request(header, contract, None, MAX)


def test_good_binary_requests_pass():
    batch = np.arange(256, dtype=np.int64).reshape(2, 128)
    header, binary = v2_body(
        [infer_input("input_ids", batch, "INT64"), infer_input("attention_mask", batch, "INT64")], ["scores", "pooled"]
    )
    check_request(header, BERT, binary, MAX)
    images = [
        infer_input("image", np.zeros((2, 1000), np.uint8), "UINT8"),
        infer_input("size", np.array([[224], [224]], np.int64), "INT64", binary=False),
    ]
    header, binary = v2_body(images)
    check_request(header, PREPROCESS, binary, MAX)
    text = [
        infer_input("text", np.array([b"a", "bé".encode(), b""], dtype=object), "BYTES"),
        infer_input("scale", np.array([0.5, 2.0], np.float16), "FP16"),
    ]
    header, binary = v2_body(text, ["tags"])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 4 + 1 + 4 + 3 + 4
    check_request(header, TAGGER, binary, MAX)


def refused(header, contract=BERT, binary=None, max_bytes=MAX):
    with pytest.raises(InvalidInput) as raised:
        check_request(header, contract, binary, max_bytes)
    assert (raised.value.status, raised.value.code) == (400, "invalid_input")
    return raised.value.message


BINARY_IDS = tensor("input_ids", "INT64", [1, 128], binary_data_size=1024)


@pytest.mark.parametrize(
    ("contract", "header", "binary", "fragments"),
    [
        (BERT, {"inputs": [ids([1], (1, 10**12)), MASK]}, None, ["'input_ids'", "1000000000000", "128"]),
        # a -1 dimension takes any size: the byte limit refuses it before the data is counted
        (
            PREPROCESS,
            {"inputs": [tensor("image", "UINT8", [1, 10**12], [1]), SIZE]},
            None,
            ["'image'", "[1, 1000000000000]", "1000000000000 bytes", f"over the {MAX} bytes"],
        ),
        (BERT, {"inputs": [ids(list(range(127))), MASK]}, None, ["'input_ids'", "128 elements", "holds 127"]),
        (BERT, {"inputs": [ids(list(range(129))), MASK]}, None, ["'input_ids'", "128 elements", "holds 129"]),
        (BERT, {"inputs": [ids(["1"] * 128), MASK]}, None, ["'input_ids'", "INT64", "whole numbers", "'1'", "str"]),
        (BERT, {"inputs": [ids([True] * 128), MASK]}, None, ["'input_ids'", "INT64", "True", "bool"]),
        (BERT, {"inputs": [ids([1.5] * 128), MASK]}, None, ["'input_ids'", "INT64", "1.5", "float"]),
        (
            PREPROCESS,
            {"inputs": [tensor("image", "UINT8", [1, 3], [0, 256, 3]), SIZE]},
            None,
            ["'image'", "256", "[0, 255]"],
        ),
        (
            PREPROCESS,
            {"inputs": [tensor("image", "UINT8", [1, 2], [-1, 3]), SIZE]},
            None,
            ["'image'", "-1", "[0, 255]"],
        ),
        (TAGGER, {"inputs": [TEXT, tensor("shift", "INT8", [1], [128])]}, None, ["'shift'", "128", "[-128, 127]"]),
        (PREPROCESS, {"inputs": [tensor("image", "UINT8", [1, -5], [1]), SIZE]}, None, ["'image'", "-5", "1 or more"]),
        (PREPROCESS, {"inputs": [tensor("image", "UINT8", [1, 0], []), SIZE]}, None, ["'image'", "is 0", "1 or more"]),
        (BERT, {"inputs": [ids(list(range(128)), (128,)), MASK]}, None, ["'input_ids'", "2 dimensions", "declares 1"]),
        (BERT, {"inputs": [ids([1], (9, 128)), MASK]}, None, ["'input_ids'", "batch of 9", "max_batch_size 8"]),
        (
            BERT,
            {"inputs": [IDS, tensor("attention_mask", "INT64", [2, 128], [[1] * 128] * 2)]},
            None,
            ["'attention_mask'", "batch of 2", "1"],
        ),
        (
            BERT,
            {"inputs": [IDS, tensor("token_type_ids", "INT64", [1, 128], [0] * 128)]},
            None,
            ["'token_type_ids'", "'bert_base'", "'input_ids'", "'attention_mask'"],
        ),
        (BERT, {"inputs": [IDS, IDS, MASK]}, None, ["'input_ids'", "twice"]),
        (BERT, {"inputs": [IDS]}, None, ["'attention_mask'", "does not give"]),
        (
            BERT,
            {"inputs": [tensor("input_ids", "INT32", [1, 128], [0] * 128), MASK]},
            None,
            ["'input_ids'", "INT64", "INT32"],
        ),
        (BERT, {"inputs": {"input_ids": [1]}}, None, ["inputs", "non-empty list", "dict"]),
        (BERT, {"inputs": []}, None, ["inputs", "an empty list"]),
        (BERT, {"inputs": ["input_ids"]}, None, ["inputs[0]", "JSON object", "str"]),
        (
            BERT,
            {"inputs": [ids([0] * 128) | {"parameters": {"binary_data_size": 1024}}, MASK]},
            b"\0" * 1024,
            ["'input_ids'", "exactly one"],
        ),
        (BERT, {"inputs": [tensor("input_ids", "INT64", [1, 128]), MASK]}, None, ["'input_ids'", "exactly one"]),
        (BERT, {"inputs": [BINARY_IDS, MASK]}, None, ["'input_ids'", "binary_data_size", "v2 JSON", BINARY_JSON_TYPE]),
        (
            BERT,
            {"inputs": [tensor("input_ids", "INT64", [1, 128], binary_data_size=512), MASK]},
            b"\0" * 512,
            ["'input_ids'", "128 elements", "1024 bytes", "512"],
        ),
        (BERT, {"inputs": [BINARY_IDS, MASK]}, b"\0" * 1000, ["'input_ids'", "1024", "only 1000"]),
        (BERT, {"inputs": [BINARY_IDS, MASK]}, b"\0" * 1030, ["1030 bytes", "add up to 1024"]),
        (
            TAGGER,
            {"inputs": [tensor("text", "BYTES", [3], binary_data_size=10)]},
            strings(b"ab", b""),
            ["'text'", "3 elements", "10 bytes"],
        ),
        (
            TAGGER,
            {"inputs": [tensor("text", "BYTES", [1], binary_data_size=9)]},
            struct.pack("<I", 100) + b"hello",
            ["'text'", "1 elements", "9 bytes"],
        ),
        (
            TAGGER,
            {"inputs": [tensor("text", "BYTES", [2], binary_data_size=8)]},
            strings(b"abc") + b"\0",
            ["'text'", "ends inside the length"],
        ),
        (TAGGER, {"inputs": [TEXT, tensor("scale", "FP16", [2], [0.5, 2.0])]}, None, ["'scale'", "FP16", "binary"]),
        (
            BERT,
            {
                "inputs": [
                    tensor("input_ids", "INT64", [1, 128], shared_memory_region="r", shared_memory_byte_size=1024),
                    MASK,
                ]
            },
            None,
            ["'input_ids'", "shared memory"],
        ),
        (BERT, {"inputs": [IDS, MASK], "outputs": [{"name": "logits"}]}, None, ["'logits'", "pooled, scores"]),
        (
            BERT,
            {"inputs": [IDS, MASK], "outputs": [{"name": "scores"}, {"name": "scores"}]},
            None,
            ["'scores'", "twice"],
        ),
        (BERT, {"inputs": [IDS, MASK], "outputs": {"name": "scores"}}, None, ["outputs", "list", "dict"]),
        (BERT, {"inputs": [IDS, MASK], "parameters": ["a"]}, None, ["parameters", "JSON object", "list"]),
        (
            BERT,
            {"inputs": [IDS, MASK], "parameters": {"priority": [1, 2]}},
            None,
            ["parameters", "'priority'", "[1, 2]"],
        ),
        (
            BERT,
            {"inputs": [ids(list(range(128))) | {"parameters": {"x": {"y": 1}}}, MASK]},
            None,
            ["'input_ids'", "'x'"],
        ),
        (BERT, [IDS, MASK], None, ["'bert_base'", "JSON object", "list"]),
    ],
)
def test_malformed_requests_are_refused(contract, header, binary, fragments):
    message = refused(header, contract, binary)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_declared_bytes_over_the_limit():
    message = refused({"inputs": [IDS, MASK]}, max_bytes=1500)
    assert "'attention_mask'" in message and "2048 bytes" in message and "1500" in message
    header, binary = v2_body([infer_input("text", np.array([b"x" * 900, b"y" * 900], dtype=object), "BYTES")])
    assert "'text'" in refused(header, TAGGER, binary, max_bytes=1000)


def test_null_parameters_are_taken_or_refused_never_a_crash():
    """``"parameters": null`` on an input or an output is an answer, not a 500 for a TypeError."""
    for header in [
        {"inputs": [IDS | {"parameters": None}, MASK]},
        {"inputs": [IDS, MASK], "outputs": [{"name": "scores", "parameters": None}]},
    ]:
        try:
            check_request(header, BERT, None, MAX)
        except InvalidInput:
            pass


def test_v2_bodies_are_recognised():
    assert is_v2({"inputs": {"x": 1}}) and is_v2({"inputs": []})
    assert not is_v2({"modelname": "x", "inputs": []}) and not is_v2({"modelname": "x", "payload": {}})
    with pytest.raises(InvalidInput):  # recognised as v2, so refused as v2
        check_request({"inputs": {"x": 1}}, BERT, None, MAX)
