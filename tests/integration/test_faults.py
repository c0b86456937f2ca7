"""Faults under a running stack: a Triton that hangs, comes back or dies (the 503 and 504 rows),
a gunicorn worker killed, clients that send their body one byte a second.

serve uses an outside Triton when TRITON_GRPC_URL is set, so the test owns this one and can
stop, continue and kill it while the router and NGINX stay up.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from scripts.devtools import alive, start_triton
from tests.support import assert_error, b64, noise_image, ping_status, wait_until

pytestmark = pytest.mark.integration

TRITON_TIMEOUT_S = 3


@pytest.fixture
def own_triton(small_repository: Path, tmp_path: Path):
    triton = start_triton(small_repository, tmp_path)
    yield triton.proc, triton.ports
    triton.stop(timeout_s=10)


def test_hung_then_back_then_dead_triton(own_triton, small_repository: Path, new_stack):
    triton, ports = own_triton
    stack = new_stack(small_repository, TRITON_GRPC_URL=f"127.0.0.1:{ports[1]}", TRITON_TIMEOUT_S=str(TRITON_TIMEOUT_S))
    stack.wait_healthy(timeout=120)
    body = {"modelname": "yolov5", "payload": {"img": b64(noise_image(320, 240, 0))}}
    assert requests.post(f"{stack.url}/invocations", json=body, timeout=30).status_code == 200

    # Hung: SIGSTOP. Invocations give up at the deadline with a 504; /ping says 503 within 2 s.
    os.killpg(triton.pid, signal.SIGSTOP)
    started = time.monotonic()
    r = requests.post(f"{stack.url}/invocations", json=body, timeout=30)
    took = time.monotonic() - started
    print(f"hung Triton: invocation answered {r.status_code} after {took:.2f} s")
    assert_error(r, 504, "inference_timeout", "yolov5")
    assert took <= TRITON_TIMEOUT_S + 1
    took = wait_until(lambda: ping_status(stack.url) == 503, timeout=5)
    print(f"hung Triton: /ping answered 503 after {took} s")
    assert took is not None and took <= 2.0

    # Back: SIGCONT. The same stack serves again, nothing restarted.
    os.killpg(triton.pid, signal.SIGCONT)
    assert wait_until(lambda: ping_status(stack.url) == 200, timeout=10) is not None
    for _ in range(4):  # whichever worker answers, its channel's failed connection is not held against it
        back = requests.post(f"{stack.url}/invocations", json=body, timeout=30)
        assert back.status_code == 200, back.text

    # Dead: SIGKILL. /ping is 503 within 2 s, invocations say triton_unavailable.
    os.killpg(triton.pid, signal.SIGKILL)
    triton.wait()
    took = wait_until(lambda: ping_status(stack.url) == 503, timeout=5)
    print(f"/ping answered 503 {took:.2f} s after Triton was killed")
    assert took is not None and took <= 2.0
    ping = requests.get(f"{stack.url}/ping", timeout=5).json()
    assert ping["status"] == "unhealthy" and ping["models"]["yolov5"] != "READY"
    assert_error(requests.post(f"{stack.url}/invocations", json=body, timeout=30), 503, "triton_unavailable")
    assert stack.proc.poll() is None, "serve keeps running: this Triton is not its child"


BROKEN_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers with outputs of the wrong rank: the router must not make a result out of that."""

    def execute(self, requests):
        responses = []
        for request in requests:
            batch = pb_utils.get_input_tensor_by_name(request, "input").as_numpy().shape[0]
            scores = pb_utils.Tensor("scores", np.zeros((batch,), dtype=np.float32))
            classes = pb_utils.Tensor("classes", np.zeros((batch,), dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[scores, classes]))
        return responses
'''


def test_a_bug_is_an_opaque_500_with_an_id_in_the_log(repository: Path, tmp_path: Path, new_stack):
    repo = tmp_path / "bug"
    shutil.copytree(repository / "resnet", repo / "resnet", ignore=shutil.ignore_patterns("*.onnx"))
    (repo / "resnet" / "1" / "model.py").write_text(BROKEN_MODEL)
    toml = repo / "resnet" / "model.toml"  # the network alone, its output read by the router
    toml.write_text('pipeline = "router"\n' + toml.read_text())
    stack = new_stack(repo)
    stack.wait_healthy(timeout=120)
    r = requests.post(
        f"{stack.url}/invocations",
        timeout=30,
        json={"modelname": "resnet", "payload": {"img": b64(noise_image(64, 64, 0))}},
    )
    assert_error(r, 500, "internal_error")
    message = r.json()["error"]["message"]
    error_id = message.split()[-1]
    assert len(error_id) >= 16 and "scores" not in message and "Error" not in message
    assert wait_until(lambda: error_id in stack.log_tail(200), timeout=5)
    logged = [line for line in stack.log_tail(200).splitlines() if error_id in line]
    assert any("traceback" in line for line in logged), logged
    assert stack.ping().status_code == 200


def test_a_killed_worker_is_replaced_and_the_next_100_requests_answer_200(small_repository: Path, new_stack):
    stack = new_stack(small_repository, MODEL_SERVER_WORKERS="2")
    stack.wait_healthy(timeout=120)
    master, *workers = stack.pids()["router"]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    body = {"modelname": "yolov5", "payload": {"img": b64(noise_image(160, 120, 5))}}
    with ThreadPoolExecutor(8) as pool:  # eight at a time, as callers would: Triton batches them
        statuses = list(
            pool.map(lambda _: requests.post(f"{stack.url}/invocations", json=body, timeout=60).status_code, range(100))
        )
    print(f"after SIGKILL of worker {workers[0]}: {statuses.count(200)} of 100 requests answered 200")
    assert statuses == [200] * 100

    def replaced() -> bool:
        now = stack.pids()["router"]
        return now[0] == master and len(now) == 3 and workers[0] not in now and not alive(workers[0])

    assert wait_until(replaced, timeout=30) is not None, stack.pids()
    assert stack.proc.poll() is None and stack.ping().status_code == 200


def _slow_client(port: int, stop: threading.Event, started: threading.Barrier) -> None:
    """Announces a 1,000-byte JSON body and sends it one byte a second until told to stop."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(
            b"POST /invocations HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        started.wait()
        while not stop.wait(1.0):
            conn.sendall(b" ")


def _latencies(stack, body: dict, count: int) -> list[float]:
    took = []
    with requests.Session() as session:
        for _ in range(count):
            began = time.perf_counter()
            r = session.post(f"{stack.url}/invocations", json=body, timeout=30)
            took.append(time.perf_counter() - began)
            assert r.status_code == 200, r.text
    return took


def test_ten_slow_clients_do_not_delay_a_normal_request(stack):
    """NGINX holds a slow body until it is complete: no router thread waits on it. Compared on the
    fastest of 20 requests each way (on two shared cores the median moves by more than 100 ms with
    whatever else runs; a request held behind slow clients would make every one of them slow)."""
    body = {"modelname": "bert_base", "payload": {"text": "The [MASK] sat on the mat.", "topk": 1}}
    _latencies(stack, body, 5)  # warm
    alone = _latencies(stack, body, 20)
    stop, started = threading.Event(), threading.Barrier(11)
    slow = [threading.Thread(target=_slow_client, args=(stack.port, stop, started), daemon=True) for _ in range(10)]
    for t in slow:
        t.start()
    try:
        started.wait(timeout=10)
        time.sleep(2.0)  # the ten are now sending their bodies
        beside = _latencies(stack, body, 20)
        assert all(t.is_alive() for t in slow), "the slow clients must still be sending"
    finally:
        stop.set()
        for t in slow:
            t.join(timeout=5)
    for name, pick in (("fastest", min), ("median", statistics.median)):
        print(
            f"{name} of 20: {pick(alone) * 1000:.1f} ms alone, {pick(beside) * 1000:.1f} ms beside ten slow "
            f"clients ({(pick(beside) - pick(alone)) * 1000:+.1f} ms)"
        )
    assert min(beside) - min(alone) <= 0.1
