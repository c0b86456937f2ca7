"""A multi-model endpoint (SAGEMAKER_MULTI_MODEL=true) with a test playing SageMaker's loader: the
real stack on :port, models loaded from folders laid out as SageMaker extracts model.tar.gz files
(/opt/ml/models/<hash>/model/...), invoked, listed and unloaded through the container API.

Three models: bert_base (ours, its config.pbtxt at the top of ``url``), resnet (ours, an ensemble
of three folders: the network, its preprocessing step and the pipeline), and ``plain``, a plain
Triton model without model.toml (resnet's network folder as it is: the same Triton name as the
network in resnet's archive, loaded beside it under a name of its own), served through KServe v2.
Their answers are compared with the one-endpoint stack's (``stack``) and with Triton's own.
A second, smaller stack (``small``) cuts requests at 1 s and bounds the models' memory so that
bert and resnet fit by their files, but not by what Triton takes for them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from app.core.model_store import triton_prefix
from app.core.settings import MIB, PROJECT_ROOT
from scripts.devtools import Stack
from tests.references import real_photos
from tests.support import ONE_INSTANCE
from tests.v2 import bert_v2, direct, model_tensors, post_v2, read_answer, send_malformed, v2_request

pytestmark = pytest.mark.integration

TEXT = {"payload": {"text": "Paris is the [MASK] of France.", "topk": 3}}


def link_copy(source: Path, target: Path) -> Path:
    """A folder as SageMaker would extract it (hard links: no bytes copied)."""
    shutil.copytree(source, target, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def files_size(*folders: Path) -> int:
    return sum(p.stat().st_size for folder in folders for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def urls(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("opt-ml-models")
    made = {}
    made["bert"] = link_copy(repository / "bert_base", root / "bert" / "model")  # config.pbtxt at the top
    for folder in ("resnet", "resnet_preprocess", "resnet_pipeline"):
        link_copy(repository / folder, root / "resnet" / "model" / folder)
    made["resnet"] = root / "resnet" / "model"
    plain = link_copy(repository / "resnet", root / "plain" / "model" / "resnet")
    (plain / "model.toml").unlink()
    made["plain"] = root / "plain" / "model"
    for folder in ("yolov5", "yolov5_preprocess", "yolov5_pipeline"):
        link_copy(repository / folder, root / "yolov5" / "model" / folder)
    made["yolov5"] = root / "yolov5" / "model"
    return made


def multi_model_stack(logs: Path, stopping: list[Stack], **env: str):
    started = Stack(
        logs, env_extra={"SAGEMAKER_MULTI_MODEL": "true", "MULTI_MODEL_DIR": str(logs / "state"), **env}
    ).start(logs)
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


@pytest.fixture(scope="module")
def mme(tmp_path_factory: pytest.TempPathFactory, stopping):
    yield from multi_model_stack(tmp_path_factory.mktemp("mme-logs"), stopping, **ONE_INSTANCE)


@pytest.fixture(scope="module")
def full_urls(
    urls: dict[str, Path], full_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """bert at full size (its 0.4 GB of weights against what Triton takes for it), resnet small."""
    root = tmp_path_factory.mktemp("opt-ml-models-full")
    return {"bert": link_copy(full_repository / "bert_base", root / "bert" / "model"), "resnet": urls["resnet"]}


@pytest.fixture(scope="module")
def small(full_urls, tmp_path_factory: pytest.TempPathFactory, stopping):
    limit = files_size(full_urls["bert"], full_urls["resnet"]) + 16 * MIB  # bert and resnet fit by their files
    yield from multi_model_stack(
        tmp_path_factory.mktemp("small-logs"), stopping, MODEL_SERVER_TIMEOUT="1", MODEL_MEMORY_LIMIT_BYTES=str(limit)
    )


def load(mme, name: str, url: Path | str) -> requests.Response:
    return requests.post(f"{mme.url}/models", json={"model_name": name, "url": str(url)}, timeout=120)


def invoke(mme, name: str, **kwargs) -> requests.Response:
    headers = {"X-Amzn-SageMaker-Target-Model": f"{name}.tar.gz", **kwargs.pop("headers", {})}
    return requests.post(f"{mme.url}/models/{name}/invoke", headers=headers, timeout=120, **kwargs)


def test_ping_is_healthy_with_nothing_loaded(mme):
    r = mme.ping()
    assert (r.status_code, r.json()) == (200, {"status": "healthy", "models": {}})
    assert requests.get(f"{mme.url}/models", timeout=5).json() == {"models": []}


def test_two_concurrent_loads_of_one_name_one_wins(mme, urls):
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: load(mme, "plain", urls["plain"]), range(2)))
    assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
    assert next(r for r in answers if r.status_code == 409).json()["error"]["code"] == "model_already_loaded"
    assert requests.delete(f"{mme.url}/models/plain", timeout=120).status_code == 200
    assert requests.get(f"{mme.url}/models", timeout=5).json() == {"models": []}


def test_three_models_load_list_and_answer(mme, stack, urls, repository):
    for name in ("bert", "resnet", "plain"):
        r = load(mme, name, urls[name])
        assert r.status_code == 200, r.text
    listed = requests.get(f"{mme.url}/models", timeout=5).json()
    assert listed == {"models": [{"modelName": n, "modelUrl": str(urls[n])} for n in ("bert", "plain", "resnet")]}
    page = requests.get(f"{mme.url}/models", params={"max_results": 2}, timeout=5).json()
    rest = requests.get(
        f"{mme.url}/models", params={"max_results": 2, "next_page_token": page["nextPageToken"]}, timeout=5
    ).json()
    assert page["models"] + rest["models"] == listed["models"] and "nextPageToken" not in rest
    assert requests.get(f"{mme.url}/models/resnet", timeout=5).json() == {
        "modelName": "resnet",
        "modelUrl": str(urls["resnet"]),
    }
    ping = mme.ping().json()
    assert ping == {"status": "healthy", "models": {"bert": "READY", "plain": "READY", "resnet": "READY"}}

    # Ours answer as the one-endpoint stack does: the envelope (its modelname is the path's) and a raw image.
    one = requests.post(f"{stack.url}/invocations", json={"modelname": "bert_base", **TEXT}, timeout=60)
    assert invoke(mme, "bert", json=TEXT).json() == one.json()
    # /invocations with the TargetModel header, as boto3 sends it to a local stack, answers the same.
    r = requests.post(
        f"{mme.url}/invocations", json=TEXT, timeout=60, headers={"X-Amzn-SageMaker-Target-Model": "bert"}
    )
    assert r.json() == one.json()
    photo = real_photos()["dog.jpg"]
    one = requests.post(
        f"{stack.url}/invocations",
        data=photo,
        timeout=60,
        headers={"Content-Type": "image/jpeg", "X-Amzn-SageMaker-Custom-Attributes": "modelname=resnet"},
    )
    r = invoke(mme, "resnet", data=photo, headers={"Content-Type": "image/jpeg"})
    assert r.status_code == 200 and r.json() == one.json()

    # The plain Triton model: v2 JSON and binary+json give Triton's own numbers.
    inputs, outputs = model_tensors(repository, "resnet")
    expected = direct(mme, triton_prefix("plain") + "resnet", inputs, outputs)  # Triton's name for it
    for binary in (False, True):
        body, json_size = v2_request(inputs, outputs, binary)
        r = post_v2(mme, body, json_size, path="/models/plain/invoke")
        assert r.status_code == 200, r.text[:300]
        got = read_answer(r).as_numpy(outputs[0])
        assert got.shape == expected[outputs[0]].shape
        assert float(np.max(np.abs(got - expected[outputs[0]]))) == 0
    r = invoke(mme, "plain", data=photo, headers={"Content-Type": "image/jpeg"})  # no family takes it raw
    assert r.status_code == 415 and "image/jpeg" in r.json()["error"]["message"], r.text
    r = invoke(mme, "plain", json={"payload": {"img": "x"}})
    assert r.status_code == 400 and "without a model.toml" in r.json()["error"]["message"], r.text


def test_malformed_v2_bodies_are_4xx_on_a_loaded_model(mme):
    """The same malformed bodies as on a one-endpoint stack, through /models/<name>/invoke and the
    TargetModel header: each a 4xx naming what is wrong, Triton the same process afterwards."""
    triton = mme.pids()["triton"][0]
    seen = send_malformed(f"{mme.url}/models/bert/invoke", **{"X-Amzn-SageMaker-Target-Model": "bert.tar.gz"})
    seen += send_malformed(f"{mme.url}/invocations", **{"X-Amzn-SageMaker-Target-Model": "bert"})
    print("\n".join(seen))
    assert mme.ping().status_code == 200 and mme.pids()["triton"][0] == triton
    r = invoke(mme, "bert", json=bert_v2())
    assert r.status_code == 200 and r.json()["model_name"] == triton_prefix("bert") + "bert_base", r.text[:300]


def test_invoke_py_target_model_calls_a_loaded_model(mme, tmp_path):
    photo = tmp_path / "dog.jpg"
    photo.write_bytes(real_photos()["dog.jpg"])
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.caller",
            "invoke",
            "--endpoint-url",
            mme.url,
            "--target-model",
            "resnet",
            f"resnet={photo}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "resnet (version 1):" in run.stdout


def test_a_repeated_load_is_409(mme, urls):
    r = load(mme, "bert", urls["bert"])
    assert (r.status_code, r.json()["error"]["code"]) == (409, "model_already_loaded")


def test_an_unload_lets_the_requests_in_flight_finish(mme, urls):
    answers: list[int] = []

    def call() -> None:
        answers.append(invoke(mme, "bert", json=TEXT).status_code)

    callers = [threading.Thread(target=call) for _ in range(8)]
    for caller in callers:
        caller.start()
    time.sleep(0.5)  # all 8 sent; a CPU serves them one batch after another
    r = requests.delete(f"{mme.url}/models/bert", timeout=120, headers={"X-Amzn-SageMaker-Target-Model": "bert.tar.gz"})
    finished = len(answers)
    for caller in callers:
        caller.join()
    assert r.status_code == 200, r.text
    assert finished == 8 and answers == [200] * 8  # every one answered before the unload returned
    r = invoke(mme, "bert", json=TEXT)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_model")
    assert requests.get(f"{mme.url}/models/bert", timeout=5).status_code == 404
    assert requests.delete(f"{mme.url}/models/bert", timeout=5).status_code == 404
    # yolov5's pipeline (network, two steps, ensemble) loads and answers beside resnet's.
    r = load(mme, "detector", urls["yolov5"])
    assert r.status_code == 200, r.text
    assert (
        invoke(mme, "detector", data=real_photos()["dog.jpg"], headers={"Content-Type": "image/jpeg"}).status_code
        == 200
    )


def test_bad_folders_are_404_and_400(mme, urls, tmp_path):
    r = load(mme, "missing", tmp_path / "nowhere")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
    (tmp_path / "empty" / "model").mkdir(parents=True)
    r = load(mme, "empty", tmp_path / "empty" / "model")
    assert r.status_code == 404 and "no config.pbtxt" in r.json()["error"]["message"]

    broken = link_copy(urls["plain"] / "resnet", tmp_path / "broken" / "model" / "classifier")
    spec = (urls["resnet"] / "resnet" / "model.toml").read_text()
    (broken / "model.toml").write_text("\n".join(line for line in spec.splitlines() if not line.startswith("family")))
    r = load(mme, "broken", tmp_path / "broken" / "model")
    assert r.status_code == 400 and "'family'" in r.json()["error"]["message"], r.text

    two = tmp_path / "two" / "model"
    link_copy(urls["plain"] / "resnet", two / "classifier")
    link_copy(urls["bert"], two / "bert_base")
    r = load(mme, "two", two)
    assert r.status_code == 400 and "one Triton model, or one ensemble" in r.json()["error"]["message"]
    assert requests.get(f"{mme.url}/models", timeout=5).json()["models"] == [
        {"modelName": n, "modelUrl": str(urls[u])}
        for n, u in (("detector", "yolov5"), ("plain", "plain"), ("resnet", "resnet"))
    ]
    assert mme.ping().status_code == 200


def test_the_model_api_is_off_on_a_one_endpoint_stack(stack):
    r = requests.get(f"{stack.url}/models", timeout=5)
    assert r.status_code == 404 and "SAGEMAKER_MULTI_MODEL=true" in r.json()["error"]["message"]


def test_loads_have_their_own_timeout_and_count_what_triton_took(small, full_urls):
    """Loads are bounded by MODEL_LOAD_TIMEOUT (360 s, SageMaker's wait), not MODEL_SERVER_TIMEOUT:
    with requests cut at 1 s, resnet's three folders (~5 s here) load through NGINX and answer.
    The memory bound fits bert and resnet by their files. Loaded, bert's ONNX Runtime session (in
    its stub process) takes more than its files: the load is undone and answered 507. Beside what
    resnet took, bert's files no longer fit: 507 before anything loads."""
    r = load(small, "bert", full_urls["bert"])
    assert (r.status_code, r.json()["error"]["code"]) == (507, "insufficient_memory"), r.text
    took = float(r.json()["error"]["message"].split("'bert' took ")[1].split(" MiB")[0])
    assert took * MIB > files_size(full_urls["bert"]), r.text
    assert requests.get(f"{small.url}/models", timeout=5).json() == {"models": []}

    begun = time.monotonic()
    r = load(small, "resnet", full_urls["resnet"])
    assert r.status_code == 200, r.text
    assert time.monotonic() - begun > 1
    r = invoke(small, "resnet", data=real_photos()["dog.jpg"], headers={"Content-Type": "image/jpeg"})
    assert r.status_code == 200, r.text

    r = load(small, "bert", full_urls["bert"])
    assert r.status_code == 507 and "the models loaded take" in r.text, r.text
    taken = float(r.json()["error"]["message"].split("the models loaded take ")[1].split(" MiB")[0])
    assert taken * MIB > files_size(full_urls["resnet"]) + 16 * MIB, r.text  # files alone would have let bert in
    assert requests.delete(f"{small.url}/models/resnet", timeout=120).status_code == 200
