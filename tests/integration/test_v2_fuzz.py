"""Property-based fuzz of KServe v2 JSON bodies against the live stack (hypothesis): from a good body
for the model, up to three mutations of shapes (0, negative, huge, not numbers), datatypes, data
(shorter, longer, nested, wrong types, out of range), names (unknown, twice, missing) and the
request's structure. No answer may be a 5xx, and Triton must be the same process at the end.

Two models: ``bert_base`` (two INT64 [batch, 128] inputs) and ``resnet_preprocess``, a plain Triton
model of the image pipeline (no model.toml; a variable-length UINT8 input and an INT64 [batch, 1]).
``V2_FUZZ_EXAMPLES`` sets the examples per model: 100 in ``make test``, 500 in ``make fuzz``.
"""

from __future__ import annotations

import collections
import json
import os

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.v2_checks import ITEM_BYTES, ModelContract

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

EXAMPLES = int(os.environ.get("V2_FUZZ_EXAMPLES", "100"))
MODELS = ("bert_base", "resnet_preprocess")
# Values a good body carries, per input (bert's token ids within its vocabulary).
GOOD_VALUES = {"input_ids": (0, 30521), "attention_mask": (0, 1), "image": (0, 255), "image_length": (1, 64)}
ODD_VALUES = st.one_of(
    st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.integers(-(2**70), 2**70),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
ODD_DIMS = st.one_of(
    st.sampled_from([0, -1, -128, 10**12, 2**63, -(2**63), 129]),
    st.integers(-5, 300),
    st.text(max_size=3),
    st.floats(allow_nan=False),
    st.none(),
)


@st.composite
def good_body(draw, contract: ModelContract) -> dict:
    batch = draw(st.integers(1, 2))
    length = draw(st.integers(1, 64))
    inputs = []
    for spec in contract.inputs.values():
        shape = [batch, *(length if d == -1 else d for d in spec.dims)]
        low, high = GOOD_VALUES.get(spec.name, (0, 1))
        value = draw(st.integers(low, high))
        count = 1
        for d in shape:
            count *= d
        inputs.append({"name": spec.name, "datatype": spec.datatype, "shape": shape, "data": [value] * count})
    return {"inputs": inputs}


@st.composite
def mutated_body(draw, contract: ModelContract):
    body = draw(good_body(contract))
    inputs = body["inputs"]
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3]))):
        tensor = inputs[draw(st.integers(0, len(inputs) - 1))] if inputs else {}
        kind = draw(
            st.sampled_from(
                [
                    "dim",
                    "rank",
                    "datatype",
                    "shorter",
                    "longer",
                    "nested",
                    "value",
                    "name",
                    "twice",
                    "drop",
                    "inputs",
                    "outputs",
                    "parameters",
                    "binary",
                    "data",
                ]
            )
        )
        if kind == "dim" and tensor.get("shape"):
            tensor["shape"][draw(st.integers(0, len(tensor["shape"]) - 1))] = draw(ODD_DIMS)
        elif kind == "rank" and "shape" in tensor:
            tensor["shape"] = draw(st.lists(ODD_DIMS, max_size=4))
        elif kind == "datatype":
            tensor["datatype"] = draw(
                st.one_of(st.sampled_from(sorted(ITEM_BYTES)), st.text(max_size=6), st.integers())
            )
        elif kind == "shorter" and isinstance(tensor.get("data"), list):
            tensor["data"] = tensor["data"][: draw(st.integers(0, max(0, len(tensor["data"]) - 1)))]
        elif kind == "longer" and isinstance(tensor.get("data"), list):
            tensor["data"] = tensor["data"] + [tensor["data"][0] if tensor["data"] else 1] * draw(st.integers(1, 300))
        elif kind == "nested" and isinstance(tensor.get("data"), list):
            width = draw(st.integers(1, 8))
            tensor["data"] = [tensor["data"][i : i + width] for i in range(0, len(tensor["data"]), width)]
        elif kind == "value" and isinstance(tensor.get("data"), list) and tensor["data"]:
            tensor["data"][draw(st.integers(0, len(tensor["data"]) - 1))] = draw(ODD_VALUES)
        elif kind == "name":
            tensor["name"] = draw(st.one_of(st.text(max_size=12), st.integers(), st.none()))
        elif kind == "twice" and tensor:
            inputs.append(dict(tensor))
        elif kind == "drop" and inputs:
            inputs.pop(draw(st.integers(0, len(inputs) - 1)))
        elif kind == "inputs":
            body["inputs"] = draw(
                st.one_of(
                    st.none(),
                    st.text(max_size=4),
                    st.integers(),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                    st.just([]),
                    st.lists(st.integers(), max_size=2),
                )
            )
        elif kind == "outputs":
            body["outputs"] = draw(
                st.one_of(
                    st.lists(
                        st.fixed_dictionaries(
                            {"name": st.one_of(st.sampled_from(sorted(contract.outputs)), st.text(max_size=6))}
                        ),
                        max_size=3,
                    ),
                    st.text(max_size=3),
                )
            )
        elif kind == "parameters":
            target = tensor if tensor and draw(st.booleans()) else body
            target["parameters"] = draw(
                st.one_of(
                    st.dictionaries(st.text(max_size=8), ODD_VALUES, max_size=3), st.lists(st.integers(), max_size=2)
                )
            )
        elif kind == "binary" and tensor:
            tensor.setdefault("parameters", {})["binary_data_size"] = draw(st.integers(-5, 10**6))
        elif kind == "data" and tensor:
            tensor["data"] = draw(ODD_VALUES)
    return body


@pytest.mark.parametrize("model", MODELS)
def test_v2_fuzz_gets_no_5xx_and_triton_lives_on(stack, repository, model):
    contract = ModelContract.from_pbtxt(model, (repository / model / "config.pbtxt").read_text())
    triton = stack.pids()["triton"][0]
    statuses: collections.Counter = collections.Counter()
    headers = {"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": model}

    @settings(
        max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(mutated_body(contract))
    def one(body: dict) -> None:
        r = requests.post(f"{stack.url}/invocations", data=json.dumps(body), headers=headers, timeout=60)
        statuses[r.status_code] += 1
        assert r.status_code < 500, (r.status_code, r.text[:300], json.dumps(body)[:400])

    one()
    print(f"{model}: {sum(statuses.values())} bodies, statuses {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= EXAMPLES
    assert stack.ping().status_code == 200 and stack.pids()["triton"][0] == triton
