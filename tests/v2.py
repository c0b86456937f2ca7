"""KServe v2 requests as clients of AWS's SageMaker Triton image build them (tritonclient's own
helpers), and the direct gRPC call to the stack's Triton they are compared with."""

from __future__ import annotations

import json

import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from clients.families import load_spec

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"


def model_tensors(repository, name: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """A batch of 2 of the model's inputs (seeded), and its output names, from its model.toml."""
    spec = load_spec(repository / name)
    rng = np.random.default_rng(7)
    inputs = {}
    for tensor in spec.inputs:
        shape = (2, *tensor.dims)
        if np.issubdtype(tensor.numpy_dtype, np.integer):
            array = rng.integers(1000, 2000, shape).astype(tensor.numpy_dtype)
            array[:, 5] = 103  # [MASK], so the fill-mask graph has work to do
        else:
            array = rng.standard_normal(shape).astype(tensor.numpy_dtype)
        inputs[tensor.name] = array
    return inputs, [t.name for t in spec.outputs]


def infer_inputs(module, inputs: dict[str, np.ndarray], **data_options) -> list:
    """``module``'s (tritonclient.http or .grpc) InferInput for each array, with its data."""
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, **data_options)
        tensors.append(tensor)
    return tensors


def v2_request(inputs: dict[str, np.ndarray], outputs: list[str], binary: bool) -> tuple[bytes, int | None]:
    """What a stock-image user sends: the body tritonclient.http builds, and its JSON header size."""
    tensors = infer_inputs(httpclient, inputs, binary_data=binary)
    wanted = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in outputs]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors, outputs=wanted)
    return body, json_size


def post_v2(stack, body: bytes, json_size: int | None, path: str = "/invocations", **headers: str) -> requests.Response:
    content_type = "application/json" if json_size is None else f"{BINARY_JSON};json-header-size={json_size}"
    return requests.post(f"{stack.url}{path}", data=body, timeout=60, headers={"Content-Type": content_type, **headers})


def read_answer(response: requests.Response) -> httpclient.InferResult:
    media, _, params = response.headers["Content-Type"].partition(";")
    header_length = int(params.split("=")[1]) if media == BINARY_JSON else None
    return httpclient.InferenceServerClient.parse_response_body(response.content, header_length=header_length)


def direct(stack, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.triton_ports[1]}")
    wanted = [grpcclient.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, infer_inputs(grpcclient, inputs), outputs=wanted)
    return {name: result.as_numpy(name) for name in outputs}


def bert_v2(ids=None, shape=(1, 128), datatype: str = "INT64") -> dict:
    """A v2 JSON body for bert_base (a good one, unless the arguments make it otherwise)."""
    ids = [101, *[1000] * 126, 102] if ids is None else ids
    return {
        "inputs": [
            {"name": "input_ids", "datatype": datatype, "shape": list(shape), "data": ids},
            {"name": "attention_mask", "datatype": "INT64", "shape": [1, 128], "data": [1] * 128},
        ]
    }


def malformed_bodies() -> list[tuple[str, bytes, str, int, str, tuple[str, ...]]]:
    """The malformed v2 bodies for bert_base that once aborted Triton or were answered 503/404: each
    as (what, body, Content-Type, status, error code, words the message must hold)."""
    header = b"{not json"
    binary = f"{BINARY_JSON};json-header-size={len(header)}"
    envelope = json.dumps({"modelname": "bert_base", "payload": {"text": "Paris is the [MASK] of France."}})
    return [
        (
            "a huge shape with short data",
            json.dumps(bert_v2([1, 2, 3], (1, 10**12))).encode(),
            "application/json",
            400,
            "invalid_input",
            ("input_ids", "1000000000000"),
        ),
        (
            "data shorter than its shape",
            json.dumps(bert_v2([5] * 100)).encode(),
            "application/json",
            400,
            "invalid_input",
            ("input_ids", "128", "100"),
        ),
        (
            "strings for INT64",
            json.dumps(bert_v2(["a"] * 128)).encode(),
            "application/json",
            400,
            "invalid_input",
            ("input_ids", "INT64"),
        ),
        (
            "a negative dimension",
            json.dumps(bert_v2(shape=(1, -128))).encode(),
            "application/json",
            400,
            "invalid_input",
            ("input_ids", "-128"),
        ),
        ("binary+json whose header is not JSON", header + b"\0" * 8, binary, 400, "invalid_json", ("JSON header",)),
        ("inputs not a list", b'{"inputs": {"x": 1}}', "application/json", 400, "invalid_input", ("inputs",)),
        (
            "an envelope as application/x-foo",
            envelope.encode(),
            "application/x-foo",
            415,
            "unsupported_media_type",
            ("application/x-foo", "application/json"),
        ),
        (
            "binary+json's type not at the start",
            header + b"\0" * 8,
            f"additional-string/{binary}",
            400,
            "invalid_input",
            ("Content-Type",),
        ),
    ]


def send_malformed(url: str, **headers: str) -> list[str]:
    """Every malformed body of ``malformed_bodies`` to ``url``; what each got, for the test's output."""
    seen = []
    for what, body, content_type, status, code, words in malformed_bodies():
        r = requests.post(url, data=body, timeout=60, headers={"Content-Type": content_type, **headers})
        assert r.status_code == status and r.headers["Content-Type"] == "application/json", (
            what,
            r.status_code,
            r.text,
        )
        error = r.json()["error"]
        assert error["code"] == code and all(word in error["message"] for word in words), (what, error)
        seen.append(f"{what}: {r.status_code} {error['code']}: {error['message'][:160]}")
    return seen
