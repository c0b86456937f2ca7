"""A family added as one module, and nothing else: a toy family written here into a temporary folder,
registered with ``FAMILY_MODULES``, is prepared by model preparation, planned by ``serve plan``, served
through the public port (its answer, ``/ping``) and described by ``/openapi.json``; without it, the
same folder is refused by name. No file of the project is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema_rs
import numpy as np
import onnx
import pytest
import requests
from onnx import TensorProto, helper

from app.core.settings import FAMILY_MODULES, PROJECT_ROOT

pytestmark = pytest.mark.integration

MODULE = "toy_scale_family"
FAMILY_SOURCE = textwrap.dedent(
    '''
    """A toy family: four comma-separated numbers in, the network's four numbers out, times the request's factor."""

    from typing import Any, ClassVar

    import numpy as np

    from app.core.errors import InvalidInput
    from app.core.family import Family
    from clients.base import ModelClient
    from clients.options import Option


    class ToyScaleClient(ModelClient[None]):
        family = "toy_scale"
        input_field = "numbers"
        content_types = frozenset()
        OPTIONS = (Option("factor", float, 0.0, 10.0, default=2.0),)
        INPUT_SCHEMA: ClassVar = {"type": "string", "pattern": "^[^,]+(,[^,]+){3}$"}
        RESULT_SCHEMA: ClassVar = {
            "type": "object",
            "description": "toy_scale: the network's numbers, times factor",
            "required": ["scaled"],
            "additionalProperties": False,
            "properties": {"scaled": {"type": "array", "items": {"type": "number"}}},
        }

        def preprocess(self, item: Any, where: str, options):
            try:
                numbers = [float(part) for part in str(item).split(",")]
            except ValueError:
                numbers = []
            if len(numbers) != 4:
                raise InvalidInput(f"{where} must be four comma-separated numbers")
            return {"x": np.asarray(numbers, dtype=np.float32)}, None

        def postprocess(self, outputs, context, options):
            return {"scaled": (outputs["y"] * options["factor"]).tolist()}


    FAMILY = Family(name=ToyScaleClient.family, client=ToyScaleClient)
    '''
)
MODEL_TOML = """\
family = "toy_scale"
max_batch_size = 4

[[inputs]]
name = "x"
dtype = "FP32"
dims = [4]

[[outputs]]
name = "y"
dtype = "FP32"
dims = [4]

[export]
onnx = "model.onnx"
"""


def tripling_graph() -> onnx.ModelProto:
    """y = 3 x, batched: the toy model's network."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    three = helper.make_tensor("three", TensorProto.FLOAT, [1], [3.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "three"], ["y"])], "toy", [x], [y], [three])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict:
    """The family's module and the model's folder, both outside the project; the environment naming it."""
    root = tmp_path_factory.mktemp("toy-family")
    (root / "families").mkdir()
    (root / "families" / f"{MODULE}.py").write_text(FAMILY_SOURCE)
    model = root / "source" / "toy"
    model.mkdir(parents=True)
    (model / "model.toml").write_text(MODEL_TOML)
    onnx.save(tripling_graph(), model / "model.onnx")
    env = {FAMILY_MODULES: MODULE, "PYTHONPATH": str(root / "families")}
    return {"root": root, "env": env}


def run(argv: list[str], env: dict, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def prepare(toy: dict, env: dict) -> subprocess.CompletedProcess:
    root = toy["root"]
    argv = [sys.executable, "-m", "scripts.model_prep", "--source", str(root / "source"), "--target", "python"]
    argv += ["--repository", str(root / "repository"), "--cache-dir", str(root / "cache"), "--models", "toy"]
    return run(argv, env)


def test_without_its_module_the_family_is_refused_by_name(toy):
    done = prepare(toy, {FAMILY_MODULES: ""})
    assert done.returncode == 1
    assert "family 'toy_scale' is not one of" in done.stderr and "image_classification" in done.stderr


def test_a_family_module_is_prepared_planned_served_and_described(toy, new_stack):
    done = prepare(toy, toy["env"])
    assert done.returncode == 0, done.stdout + done.stderr
    repository = toy["root"] / "repository"
    assert (repository / "toy" / "1" / "model.onnx").is_file() and (repository / "toy" / "config.pbtxt").is_file()

    plan = run([sys.executable, str(PROJECT_ROOT / "serve"), "plan", "--repository", str(repository)], toy["env"])
    assert plan.returncode == 0, plan.stderr
    assert any(line.split()[:1] == ["toy"] for line in plan.stdout.splitlines()), plan.stdout

    stack = new_stack(repository, **toy["env"])
    stack.wait_healthy()
    ping = requests.get(f"{stack.url}/ping", timeout=10).json()
    assert ping["models"] == {"toy": "READY"}

    body = {"modelname": "toy", "payload": {"numbers": "1,2,3,4", "factor": 0.5}}
    r = requests.post(f"{stack.url}/invocations", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["result"]["scaled"], [1.5, 3.0, 4.5, 6.0])
    refused = requests.post(
        f"{stack.url}/invocations", json={"modelname": "toy", "payload": {"numbers": "1"}}, timeout=30
    )
    assert refused.status_code == 400 and "payload.numbers must be four comma-separated numbers" in refused.text
    both = {"modelname": "toy", "payload": {"numbers": ["1,1,1,1", "0,0,0,2"]}}  # the default factor, 2
    assert requests.post(f"{stack.url}/invocations", json=both, timeout=30).json()["result"] == [
        {"scaled": [6.0, 6.0, 6.0, 6.0]},
        {"scaled": [0.0, 0.0, 0.0, 12.0]},
    ]

    document = requests.get(f"{stack.url}/openapi.json", timeout=10).json()
    schemas = document["components"]["schemas"]
    factor = schemas["Payload"]["properties"]["factor"]
    assert (factor["minimum"], factor["maximum"], factor["default"]) == (0.0, 10.0, 2.0)
    assert "numbers" in schemas["Payload"]["properties"]
    result = jsonschema_rs.validator_for({"$ref": "#/components/schemas/ToyScaleResult", **document})
    assert result.is_valid(r.json()["result"]) and not result.is_valid({"scaled": "no"})
    assert json.dumps(schemas["ToyScaleResult"]["properties"]) == json.dumps(
        {"scaled": {"type": "array", "items": {"type": "number"}}}
    )
