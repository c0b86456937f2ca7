"""The sizing at start, on the real stack: what `serve`'s start record says it chose is what runs
(gunicorn's workers, NGINX's, and each configuration Triton loaded, read from Triton itself), on
this machine's vCPUs, pinned to one CPU (``taskset -c 0``) and seeing 16 (SIZING_VCPUS); the
repository is never written; a multi-model load is sized beside what is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from app.core.machine import Machine
from app.core.model_store import triton_prefix
from app.core.settings import PROJECT_ROOT
from clients import sized_configs
from scripts.devtools import Stack, children_of, wait_http
from tests.references import darknet_photos
from tests.support import post

pytestmark = pytest.mark.integration


class PinnedStack(Stack):
    """``serve`` started under ``taskset -c 0``: every process it starts may use CPU 0 alone."""

    def command(self):
        return ["taskset", "-c", "0", sys.executable, str(PROJECT_ROOT / "serve")], PROJECT_ROOT, "serve-pinned"


def start_record(stack: Stack) -> dict:
    """The start log record of the sizing (logger serve.sizing)."""
    for line in stack.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"serve.sizing"' in line:
            entry = json.loads(line)
            if "sizing" in entry:
                return entry
    raise AssertionError(f"no sizing record in the log:\n{stack.log_tail()}")


def triton_config(stack: Stack, model: str) -> dict:
    # /ping turns 200 once Triton answers over gRPC, a service it starts before its HTTP one: on a
    # loaded machine a request sent just after can find Triton's HTTP port still closed.
    wait_http("127.0.0.1", stack.triton_ports[0], f"/v2/models/{model}/ready", 30, stack.proc)
    answer = requests.get(f"http://127.0.0.1:{stack.triton_ports[0]}/v2/models/{model}/config", timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()


def nginx_workers(stack: Stack) -> int:
    master = stack.pids()["nginx"][0]
    return len(children_of(master))


def assert_running_as_planned(stack: Stack, record: dict) -> None:
    """gunicorn's and NGINX's workers and every sized configuration Triton holds, against the record."""
    plan = record["sizing"]
    assert len(stack.router_workers()) == plan["router_workers"]
    assert nginx_workers(stack) == plan["nginx_workers"]
    for name, part in plan["models"].items():
        config = triton_config(stack, name)
        assert [group["count"] for group in config["instance_group"]] == [part["count"]], name
        if part["kind"] == "cpu_network":
            assert config["parameters"]["ort_intra_op_threads"]["string_value"] == str(part["threads"]), name


def test_the_start_record_is_what_runs_on_this_machine(stack):
    record = start_record(stack)
    plan = record["sizing"]
    print(record["message"])
    assert plan["machine"]["vcpus"] == len(os.sched_getaffinity(0)) and plan["machine"]["gpus"] == 0
    assert set(plan["models"]) == {"resnet", "resnet_preprocess", "yolov5", "yolov5_preprocess", "bert_base"}
    assert_running_as_planned(stack, record)


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``folder``: its mode and content hash (symlinks by their target)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(folder))] = (path.stat().st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def read_only_copy(repository: Path, target: Path) -> Path:
    """The repository copied (python caches left out), its files and folders made read-only."""
    import shutil

    shutil.copytree(repository, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return target


def test_pinned_to_one_cpu_on_a_read_only_repository(small_repository, tmp_path, stopping):
    """One vCPU by affinity: every part at its floor; nothing written into the repository."""
    repository = read_only_copy(small_repository, tmp_path / "models")
    before = snapshot(repository)
    pinned = PinnedStack(repository, env_extra={"PYTHONDONTWRITEBYTECODE": "1"}).start(tmp_path)
    stopping.append(pinned)
    pinned.wait_healthy()
    record = start_record(pinned)
    print(record["message"])
    plan = record["sizing"]
    assert (plan["machine"]["vcpus"], plan["budget"]) == (1.0, 1)
    assert "CPU affinity 1" in plan["machine"]["source"]
    assert {name: (p["count"], p["threads"]) for name, p in plan["models"].items()} == {
        "yolov5": (1, 1),
        "yolov5_preprocess": (1, 0),
    }
    assert (plan["router_workers"], plan["nginx_workers"]) == (2, 1)
    assert "oversubscribed" in plan["notes"][0]
    assert_running_as_planned(pinned, record)
    affinity = subprocess.run(["taskset", "-p", str(pinned.router_workers()[0])], capture_output=True, text=True)
    assert affinity.stdout.strip().endswith(": 1"), affinity.stdout  # the mask: CPU 0 alone
    (photo,) = list(darknet_photos().values())[:1]
    answer = post(pinned, photo, "image/jpeg", "modelname=yolov5")
    assert answer.status_code == 200, answer.text
    pinned.stop()
    assert snapshot(repository) == before, "serve wrote into the repository"


@pytest.fixture(scope="module")
def sixteen(repository, tmp_path_factory, stopping):
    """The stack seeing 16 vCPUs (SIZING_VCPUS) on this machine's."""
    started = Stack(repository, env_extra={"SIZING_VCPUS": "16"}).start(tmp_path_factory.mktemp("sixteen"))
    stopping.append(started)
    started.wait_healthy()
    yield started
    started.begin_stop()


def test_seeing_16_vcpus_the_counts_follow_the_table(sixteen, repository):
    record = start_record(sixteen)
    print(record["message"])
    expected = sized_configs.plan_repository(repository, Machine(16.0), {})[0]
    plan = record["sizing"]
    assert plan["machine"]["vcpus"] == 16.0 and plan["budget"] == 16 and plan["cpu_threads"] <= 16
    assert (plan["router_workers"], plan["nginx_workers"]) == (expected.router_workers, expected.nginx_workers)
    assert {name: (p["count"], p["threads"]) for name, p in plan["models"].items()} == {
        part.triton_name: (part.count, part.threads) for part in expected.parts
    }
    # the rules' table for 16 vCPUs (tests/unit/test_sizing.py): more than the floors
    assert plan["models"]["resnet"]["count"] * plan["models"]["resnet"]["threads"] >= 3
    assert_running_as_planned(sixteen, record)


def test_seeing_16_vcpus_every_model_still_answers(sixteen):
    photos = list(darknet_photos().values())
    for model in ("resnet", "yolov5"):
        for photo in photos[:3]:
            answer = post(sixteen, photo, "image/jpeg", f"modelname={model}")
            assert answer.status_code == 200, answer.text
    text = {"modelname": "bert_base", "payload": {"text": "Paris is the [MASK] of France."}}
    answer = post(sixteen, text)
    assert answer.status_code == 200 and answer.json()["result"], answer.text


def test_a_multi_model_load_is_sized_beside_what_is_loaded(repository, tmp_path, stopping):
    state = tmp_path / "state"
    mme = Stack(
        repository, env_extra={"SAGEMAKER_MULTI_MODEL": "true", "MULTI_MODEL_DIR": str(state), "SIZING_VCPUS": "16"}
    ).start(tmp_path)
    stopping.append(mme)
    mme.wait_healthy()
    assert start_record(mme)["sizing"]["models"] == {}  # nothing loaded at start: router and NGINX only

    def load(name: str, folders: list[str]) -> None:
        url = tmp_path / "opt-ml-models" / name
        for folder in folders:
            os.makedirs(url, exist_ok=True)
            os.symlink(repository / folder, url / folder)
        answer = requests.post(f"{mme.url}/models", json={"model_name": name, "url": str(url)}, timeout=120)
        assert answer.status_code == 200, answer.text

    def threads_of(name: str, model: str) -> tuple[int, int]:
        config = triton_config(mme, triton_prefix(name) + model)
        return config["instance_group"][0]["count"], int(config["parameters"]["ort_intra_op_threads"]["string_value"])

    load("bert", ["bert_base"])
    alone = threads_of("bert", "bert_base")
    load("resnet", ["resnet", "resnet_preprocess", "resnet_pipeline"])
    beside = threads_of("resnet", "resnet")
    print(f"bert_base alone: {alone[0]} x {alone[1]}; resnet loaded beside it: {beside[0]} x {beside[1]}")
    machine = Machine(16.0)
    workers = {"MODEL_SERVER_WORKERS": str(start_record(mme)["sizing"]["router_workers"]), "NGINX_WORKERS": "1"}
    expected_alone = sized_configs.plan_repository(_only(repository, tmp_path / "a", ["bert_base"]), machine, workers)[
        0
    ]
    together = sized_configs.plan_repository(
        _only(repository, tmp_path / "b", ["bert_base", "resnet", "resnet_preprocess"]), machine, workers
    )[0]
    assert alone == (expected_alone.part("bert_base").count, expected_alone.part("bert_base").threads)
    assert beside == (together.part("resnet").count, together.part("resnet").threads)
    assert beside[0] * beside[1] < alone[0] * alone[1]  # the second model shares the budget with the first
    (photo,) = list(darknet_photos().values())[:1]
    answer = requests.post(
        f"{mme.url}/models/resnet/invoke", data=photo, headers={"Content-Type": "image/jpeg"}, timeout=60
    )
    assert answer.status_code == 200, answer.text


def _only(repository: Path, target: Path, folders: list[str]) -> Path:
    target.mkdir()
    for folder in folders:
        os.symlink(repository / folder, target / folder)
    return target
