"""KServe v2 requests as clients of AWS's SageMaker Triton image build them (tritonclient's own
helpers), and the direct gRPC call to the stack's Triton they are compared with."""

from __future__ import annotations

import numpy as np
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


def post_v2(stack, body: bytes, json_size: int | None, path: str = "/invocations", **headers: str) -> requests.Response:
    content_type = "application/json" if json_size is None else f"{BINARY_JSON};json-header-size={json_size}"
    return requests.post(f"{stack.url}{path}", data=body, timeout=60,
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
