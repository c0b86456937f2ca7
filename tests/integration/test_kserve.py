"""KServe v2 pass-through on /invocations, as clients of AWS's SageMaker Triton image send it: requests
built with tritonclient's own helpers (v2 JSON, and binary+json) for the models' own tensors, through
the real stack's port, against a direct gRPC call to the same Triton."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from tests.v2 import BINARY_JSON, bert_v2, direct, model_tensors, post_v2, read_answer, send_malformed, v2_request

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("binary", [False, True], ids=["v2-json", "binary+json"])
@pytest.mark.parametrize(("model", "how"), [("resnet", "target-model"), ("bert_base", "custom-attribute")])
def test_v2_requests_give_the_numbers_of_a_direct_grpc_call(stack, repository, model, how, binary):
    inputs, outputs = model_tensors(repository, model)
    body, json_size = v2_request(inputs, outputs, binary)
    assert (json_size is not None) == binary
    names = (
        {"X-Amzn-SageMaker-Target-Model": f"{model}.tar.gz"}
        if how == "target-model"
        else {"X-Amzn-SageMaker-Custom-Attributes": f"modelname={model}"}
    )
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
    r = requests.post(
        f"{stack.url}/invocations",
        data=body,
        timeout=60,
        headers={"Content-Type": BINARY_JSON, "X-Amzn-SageMaker-Target-Model": "resnet"},
    )
    assert r.status_code == 400 and "json-header-size" in r.json()["error"]["message"]


def test_malformed_v2_bodies_are_4xx_and_triton_lives_on(stack):
    """Bodies that once aborted Triton (a huge shape) or were answered 503/404 get a 4xx naming
    what is wrong; Triton is the same process afterwards and serves the next good request."""
    triton = stack.pids()["triton"][0]
    seen = send_malformed(f"{stack.url}/invocations", **{"X-Amzn-SageMaker-Target-Model": "bert_base"})
    # A huge shape where the model has a variable dimension is refused by its declared bytes.
    huge = {
        "inputs": [
            {"name": "image", "datatype": "UINT8", "shape": [1, 10**12], "data": [255, 216]},
            {"name": "image_length", "datatype": "INT64", "shape": [1, 1], "data": [2]},
        ]
    }
    r = requests.post(
        f"{stack.url}/invocations",
        json=huge,
        timeout=60,
        headers={"X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet_pipeline"},
    )
    assert r.status_code == 400 and "'image'" in r.json()["error"]["message"], r.text
    seen.append(f"a huge variable dimension: {r.status_code} {r.json()['error']['message'][:160]}")
    print("\n".join(seen))
    assert stack.ping().status_code == 200
    assert stack.pids()["triton"][0] == triton
    r = requests.post(
        f"{stack.url}/invocations", json=bert_v2(), timeout=60, headers={"X-Amzn-SageMaker-Target-Model": "bert_base"}
    )
    assert r.status_code == 200 and r.json()["model_name"] == "bert_base", r.text[:300]


def test_values_a_model_refuses_are_a_400_and_fail_no_other_request(stack):
    """A token id past BERT's vocabulary passes every check of shape and type; ONNX Runtime refuses
    it. That is the caller's fault (400), and a good request sent beside it still answers."""
    bad = bert_v2([101, *[10**9] * 126, 102])
    headers = {"X-Amzn-SageMaker-Target-Model": "bert_base"}
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda body: requests.post(f"{stack.url}/invocations", json=body, timeout=60, headers=headers),
                [bad, bert_v2(), bad, bert_v2()],
            )
        )
    assert [r.status_code for r in answers] == [400, 200, 400, 200], [r.text[:200] for r in answers]
    assert "out of data bounds" in answers[0].json()["error"]["message"]
