"""The CPU serving image, built (cached layers) and run as SageMaker runs it: `run -p PORT:8080 -v
<repository>:/opt/ml/model:ro IMAGE serve`, checked from outside over real sockets. Selected with
`-m container` (they are integration tests too: they start the whole stack, in a container)."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from app.core.settings import MIB, PROJECT_ROOT
from scripts.devtools import free_ports
from scripts.image.engine import Engine, can_publish, find_engine, run_args, settle_podman
from tests.support import noise_image, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.container]

TAG = "multi-model:cpu"
PING_WITHIN_S = 30
SAMPLE = PROJECT_ROOT / "build" / "samples" / "dog.jpg"


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The image built as `make image` builds it (its layers cached after the first build)."""
    began = time.monotonic()
    built = subprocess.run(
        [sys.executable, "-m", "scripts.image", "build", "--tag", TAG],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    print(f"\nimage built in {time.monotonic() - began:.1f} s:\n" + "\n".join(built.stdout.splitlines()[-7:]))
    found = find_engine()
    settle_podman(found, TAG)
    return found


@pytest.fixture(scope="module")
def publish(engine: Engine) -> bool:
    return can_publish(engine, TAG)


@dataclass
class Container:
    engine: Engine
    name: str
    port: int
    ping_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shell(self, command: str) -> subprocess.CompletedProcess:
        return self.engine.run("exec", self.name, "sh", "-c", command, check=False, quiet=True)

    def logs(self) -> str:
        shown = self.engine.run("logs", self.name, check=False, quiet=True)
        return "\n".join((shown.stdout + shown.stderr).splitlines()[-40:])

    def remove(self) -> None:
        self.engine.run("rm", "-f", "-t", "5", self.name, check=False, quiet=True)


@pytest.fixture
def containers(engine: Engine, publish: bool):
    """Starts containers of the image as SageMaker does; removes them all at the end of the test."""
    started: list[Container] = []

    def start(repository: Path | None, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> Container:
        port = free_ports(1)[0]
        container = Container(engine, f"multi-model-test-{uuid.uuid4().hex[:8]}", port)
        started.append(container)
        argv = run_args(repository, port, TAG, publish=publish, env=env, extra=["-d", "--name", container.name, *extra])
        engine.run(*argv, quiet=True)
        began = time.monotonic()
        healthy = wait_until(lambda: _status(f"{container.url}/ping") == 200, timeout=PING_WITHIN_S + 30)
        container.ping_after_s = None if healthy is None else time.monotonic() - began
        assert container.ping_after_s is not None, f"/ping never answered 200:\n{container.logs()}"
        return container

    yield start
    for container in started:
        container.remove()


def _status(url: str) -> int | None:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return None


def readable_by_all(folder: Path) -> None:
    """What SageMaker's extraction gives the container's non-root user: every file readable."""
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def raw(url: str, model: str, body: bytes, content_type: str) -> requests.Response:
    headers = {"Content-Type": content_type, "X-Amzn-SageMaker-Custom-Attributes": f"modelname={model}"}
    return requests.post(f"{url}/invocations", data=body, headers=headers, timeout=120)


def test_run_as_sagemaker_runs_it_every_model_answers(containers, repository: Path):
    container = containers(repository)
    print(f"/ping 200 {container.ping_after_s:.1f} s after `run`")
    assert container.ping_after_s <= PING_WITHIN_S
    photo = SAMPLE.read_bytes() if SAMPLE.is_file() else noise_image(640, 480, 1)
    resnet = raw(container.url, "resnet", photo, "image/jpeg")
    assert resnet.status_code == 200, resnet.text
    assert resnet.json()["modelname"] == "resnet" and len(resnet.json()["result"]) >= 1
    yolov5 = raw(container.url, "yolov5", photo, "image/jpeg")
    assert yolov5.status_code == 200, yolov5.text
    assert {"width", "height", "detections"} <= set(yolov5.json()["result"])
    bert = raw(container.url, "bert_base", b"Paris is the [MASK] of France.", "text/plain")
    assert bert.status_code == 200, bert.text
    assert all("[MASK]" not in c["sequence"] for c in bert.json()["result"])

    # The repository is read-only, and nothing in the container runs as root.
    written = container.shell("touch /opt/ml/model/written-by-the-container")
    assert written.returncode != 0 and "Read-only file system" in written.stderr
    uids = container.shell("for f in /proc/[0-9]*/status; do grep '^Uid:' $f; done").stdout.split("\n")
    real_uids = {line.split()[1] for line in uids if line.startswith("Uid:")}
    assert real_uids == {"1000"}, uids
    # Triton loaded the configs sized for the container's CPUs, from the runtime folder, not the mount;
    # `serve plan` (the image's entrypoint's subcommand) prints the plan without starting anything.
    sized = container.shell("cat /tmp/serve-*/repository/resnet/config.pbtxt")
    assert sized.returncode == 0 and 'key: "sizing"' in sized.stdout and "instance_group" in sized.stdout, sized
    plan = container.shell("serve plan --instance-type ml.g5.xlarge")
    assert plan.returncode == 0 and "Plan for ml.g5.xlarge: 4 vCPUs, 1 x NVIDIA A10G" in plan.stdout, plan


def test_stop_while_eight_requests_are_in_flight(containers, engine: Engine, full_detector_repository: Path):
    """SageMaker stops a container with SIGTERM and kills it 30 s later: the requests in flight are
    answered and the container exits 0 before that."""
    readable_by_all(full_detector_repository)  # a temporary folder: its owner alone may read it
    container = containers(full_detector_repository)
    body = {
        "modelname": "yolov5",
        # 3 images a request: seconds of work in flight at the stop, well within the 25 s drain even
        # with the rest of the suite running beside it (8 a request took more on a busy 2-core machine).
        "payload": {"img": [base64.b64encode(noise_image(640, 480, i)).decode() for i in range(3)]},
    }

    def call(_: int) -> requests.Response:
        return requests.post(f"{container.url}/invocations", json=body, timeout=90)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(call, i) for i in range(8)]
        time.sleep(0.5)
        early = [f.result() for f in futures if f.done()]
        assert not early, f"requests finished before the stop: {[(r.status_code, r.text[:200]) for r in early]}"
        began = time.monotonic()
        stopped = engine.run("stop", "-t", "30", container.name, check=False, quiet=True)
        took = time.monotonic() - began
        responses = [f.result() for f in futures]
    code = engine.run("inspect", "--format", "{{.State.ExitCode}}", container.name, quiet=True).stdout.strip()
    print(f"statuses {[r.status_code for r in responses]}; the container exited {code} {took:.1f} s after `stop`")
    assert stopped.returncode == 0, stopped.stderr
    assert [r.status_code for r in responses] == [200] * 8
    assert code == "0" and took < 30


def _model_archive(repository: Path, root: Path, name: str, folders: tuple[str, ...]) -> None:
    """A model as SageMaker extracts its model.tar.gz under /opt/ml/models/<name>/model."""
    for folder in folders:
        subprocess.run(["cp", "-r", str(repository / folder), str(root / name / "model" / folder)], check=True)


@pytest.fixture
def opt_ml_models(repository: Path, full_repository: Path, tmp_path: Path) -> Path:
    root = tmp_path / "opt-ml-models"
    for name, source, folders in (
        ("resnet", repository, ("resnet", "resnet_preprocess", "resnet_pipeline")),
        ("bert", full_repository, ("bert_base",)),
    ):
        (root / name / "model").mkdir(parents=True)
        _model_archive(source, root, name, folders)
    return root


def test_multi_model_mode_loads_answers_and_unloads(containers, opt_ml_models: Path):
    env = {"SAGEMAKER_MULTI_MODEL": "true"}
    container = containers(None, env, ("-v", f"{opt_ml_models}:/opt/ml/models:ro"))
    load = requests.post(
        f"{container.url}/models", json={"model_name": "resnet", "url": "/opt/ml/models/resnet/model"}, timeout=180
    )
    assert load.status_code == 200, load.text
    listed = requests.get(f"{container.url}/models", timeout=10).json()
    assert [m["modelName"] for m in listed["models"]] == ["resnet"]
    _assert_resnet_answers(container)
    assert requests.delete(f"{container.url}/models/resnet", timeout=180).status_code == 200
    assert requests.get(f"{container.url}/models", timeout=10).json()["models"] == []


def _assert_resnet_answers(container) -> None:
    """The loaded ``resnet`` answers a photo, as SageMaker's multi-model endpoint invokes it."""
    photo = SAMPLE.read_bytes() if SAMPLE.is_file() else noise_image(640, 480, 1)
    answer = requests.post(
        f"{container.url}/models/resnet/invoke",
        data=photo,
        headers={"Content-Type": "image/jpeg", "X-Amzn-SageMaker-Target-Model": "resnet.tar.gz"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["modelname"] == "resnet"


def test_a_load_that_does_not_fit_the_containers_memory_is_507(containers, opt_ml_models: Path):
    """Started with --memory: BERT base's 0.5 GB of weights do not fit beside the stack in 512 MiB,
    and the load is refused before Triton takes any of it."""
    env = {"SAGEMAKER_MULTI_MODEL": "true"}
    container = containers(None, env, ("-v", f"{opt_ml_models}:/opt/ml/models:ro", "--memory", f"{512 * MIB}"))
    load = requests.post(
        f"{container.url}/models", json={"model_name": "bert", "url": "/opt/ml/models/bert/model"}, timeout=180
    )
    print(f"load in 512 MiB: {load.status_code} {load.text[:300]}")
    assert load.status_code == 507, load.text
    assert load.json()["error"]["code"] == "insufficient_memory" and "available" in load.json()["error"]["message"]
    assert _status(f"{container.url}/ping") == 200  # and it keeps serving


# A Triton model (no model.toml) whose stub takes far more memory than its files while it initializes,
# as a network whose session outgrows its weights would: its few bytes of files pass the router's check.
HOG_CONFIG = """name: "hog"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group { count: 1 kind: KIND_CPU }
"""
HOG_MODEL = """
import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        with open("/proc/self/oom_score_adj", "w") as score:
            score.write("1000")  # as the stubs of app/triton/onnx_model.py do
        self.blocks = [np.ones(16 * 1024 * 1024, np.float32) for _ in range(64)]  # 4 GiB, every page touched

    def execute(self, requests):
        raise NotImplementedError
"""


def test_a_load_that_runs_the_container_out_of_memory_is_507_and_the_others_keep_answering(
    containers, opt_ml_models: Path
):
    """Started with --memory 1 GiB, resnet loaded: a model whose stub outgrows the container while it
    loads is ended by the kernel's OOM killer (the stub's score is the highest), Triton refuses that
    load, the router answers 507 naming the OOM killer, and resnet still answers: Triton lived on."""
    hog = opt_ml_models / "hog" / "model"
    (hog / "1").mkdir(parents=True)
    (hog / "config.pbtxt").write_text(HOG_CONFIG)
    (hog / "1" / "model.py").write_text(HOG_MODEL)
    here = set(os.listdir())  # conmon notes an OOM in a file of its working directory: not in ours
    env = {"SAGEMAKER_MULTI_MODEL": "true"}
    container = containers(None, env, ("-v", f"{opt_ml_models}:/opt/ml/models:ro", "--memory", f"{1024 * MIB}"))
    models = f"{container.url}/models"
    load = requests.post(models, json={"model_name": "resnet", "url": "/opt/ml/models/resnet/model"}, timeout=180)
    assert load.status_code == 200, load.text
    _assert_resnet_answers(container)
    load = requests.post(models, json={"model_name": "hog", "url": "/opt/ml/models/hog/model"}, timeout=180)
    print(f"load of 4 GiB in 1 GiB: {load.status_code} {load.text[:300]}")
    assert load.status_code == 507, load.text
    assert load.json()["error"]["code"] == "insufficient_memory" and "OOM killer" in load.json()["error"]["message"]
    assert _status(f"{container.url}/ping") == 200
    _assert_resnet_answers(container)
    assert [m["modelName"] for m in requests.get(models, timeout=10).json()["models"]] == ["resnet"]
    assert "oom" not in set(os.listdir()) - here


def _port_free(port: int) -> bool:
    """Can a server listen on ``port`` now (SO_REUSEADDR, as servers do: closed connections do not count)?"""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("0.0.0.0", port))
            server.listen()
        except OSError:
            return False
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_image_run_stops_and_removes_its_container_on_a_signal(
    engine: Engine, small_repository: Path, tmp_path: Path, signum: signal.Signals
):
    """`make image-run` (`python -m scripts.image run`) sent SIGTERM (a supervisor, `timeout`), SIGHUP (a
    closed terminal) or SIGINT (Ctrl-C) stops its container as SageMaker does, within the 30 s, and
    leaves neither the container nor its port behind. One model is served: each start is quick."""
    readable_by_all(small_repository)  # a temporary folder: its owner alone may read it
    port = free_ports(1)[0]
    name = f"multi-model-{port}"  # the script's name for it
    url = f"http://127.0.0.1:{port}"
    output = tmp_path / "run.log"
    argv = [sys.executable, "-m", "scripts.image", "run", "--tag", TAG, "--repository", str(small_repository)]
    # SIGINT and SIGHUP handled as in a terminal, also where this run inherited them ignored (a
    # shell's background job, nohup): an ignored disposition passes to the script through exec, a
    # handler or the default does not.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    inherited_hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with output.open("w") as log:
        script = subprocess.Popen(
            [*argv, "--port", str(port)],
            cwd=PROJECT_ROOT,
            env={**os.environ, **engine.env},  # podman as settled here (no second probe)
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    signal.signal(signal.SIGINT, inherited)
    signal.signal(signal.SIGHUP, inherited_hup)
    try:
        serving = wait_until(lambda: _status(f"{url}/ping") == 200, timeout=PING_WITHIN_S + 30)
        assert serving is not None, f"/ping never answered 200:\n{output.read_text()[-3000:]}"
        began = time.monotonic()
        script.send_signal(signum)
        status = script.wait(timeout=60)
        took = time.monotonic() - began
        left = engine.run("ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}", quiet=True).stdout
        print(f"{signum.name}: the script exited {status} {took:.1f} s later; containers left: {left.split()}")
        assert status == 128 + signum, output.read_text()[-3000:]
        assert f"stopping container {name} ({signum.name}), up to 30 s" in output.read_text()
        assert took < 30 + 10  # the grace, and the engine's own time to remove it
        assert left.strip() == ""
        assert _port_free(port)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        engine.run("rm", "-f", name, check=False, quiet=True)
