"""KServe v2 pass-through on /invocations, as clients of AWS's SageMaker Triton image send it: requests
built with tritonclient's own helpers (v2 JSON, and binary+json) for the models' own tensors, through
the real stack's port, against a direct gRPC call to the same Triton."""

from __future__ import annotations

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from app.core.spec import load_spec

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


def post_v2(stack, body: bytes, json_size: int | None, **headers: str) -> requests.Response:
    content_type = "application/json" if json_size is None else f"{BINARY_JSON};json-header-size={json_size}"
    return requests.post(f"{stack.url}/invocations", data=body, timeout=60,
                         headers={"Content-Type": content_type, **headers})


def read_answer(response: requests.Response) -> httpclient.InferResult:
    media, _, params = response.headers["Content-Type"].partition(";")
    header_length = int(params.split("=")[1]) if media == BINARY_JSON else None
    return httpclient.InferenceServerClient.parse_response_body(response.content, header_length=header_length)


def direct(stack, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.triton_ports[1]}")
    wanted = [grpcclient.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, infer_inputs(grpcclient, inputs), outputs=wanted)
    return {name: result.as_numpy(name) for name in outputs}


@pytest.mark.parametrize("binary", [False, True], ids=["v2-json", "binary+json"])
@pytest.mark.parametrize(("model", "how"), [("resnet", "target-model"), ("bert_base", "custom-attribute")])
def test_v2_requests_give_the_numbers_of_a_direct_grpc_call(stack, repository, model, how, binary):
    inputs, outputs = model_tensors(repository, model)
    body, json_size = v2_request(inputs, outputs, binary)
    assert (json_size is not None) == binary
    names = ({"X-Amzn-SageMaker-Target-Model": f"{model}.tar.gz"} if how == "target-model"
             else {"X-Amzn-SageMaker-Custom-Attributes": f"modelname={model}"})
    r = post_v2(stack, body, json_size, **names)
    assert r.status_code == 200, r.text[:300]
    assert r.headers["Content-Type"].startswith(BINARY_JSON if binary else "application/json")
    answer = read_answer(r)
    expected = direct(stack, model, inputs, outputs)
    for name in outputs:
        got = answer.as_numpy(name)
        assert got.shape == expected[name].shape and got.dtype == expected[name].dtype
        diff = float(np.max(np.abs(got.astype(np.float64) - expected[name].astype(np.float64))))
        print(f"{model} {'binary+json' if binary else 'v2 JSON'} {name}: max abs diff {diff}")
        assert diff == 0


@pytest.mark.parametrize("binary", [False, True], ids=["v2-json", "binary+json"])
def test_a_wrong_shape_is_a_400_with_tritons_message(stack, repository, binary):
    inputs, outputs = model_tensors(repository, "resnet")
    inputs["input"] = inputs["input"][:, :, :100, :100]
    body, json_size = v2_request(inputs, outputs, binary)
    r = post_v2(stack, body, json_size, **{"X-Amzn-SageMaker-Target-Model": "resnet"})
    assert r.status_code == 400 and r.headers["Content-Type"] == "application/json", r.text
    error = r.json()["error"]
    print(error)
    assert error["code"] == "invalid_input" and "resnet" in error["message"] and "shape" in error["message"]
    assert stack.ping().status_code == 200


def test_v2_errors_a_caller_can_act_on(stack, repository):
    inputs, outputs = model_tensors(repository, "resnet")
    body, _ = v2_request(inputs, outputs, binary=False)
    r = post_v2(stack, body, None)
    assert r.status_code == 400 and "names no model" in r.json()["error"]["message"]
    r = post_v2(stack, body, None, **{"X-Amzn-SageMaker-Target-Model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model", r.text
    r = requests.post(f"{stack.url}/invocations", data=body, timeout=60,
                      headers={"Content-Type": BINARY_JSON, "X-Amzn-SageMaker-Target-Model": "resnet"})
    assert r.status_code == 400 and "json-header-size" in r.json()["error"]["message"]
