"""NGINX with the real nginx.conf and nothing behind it (the router and the ping server gone, as
while one is restarting or the stack is going down): every caller gets the contract's JSON 503,
never NGINX's own 502 (a unix socket with no listener is a 502 to NGINX)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import requests

from app.serve.nginx import find_nginx, nginx_command
from scripts.devtools import free_ports
from tests.support import assert_error, wait_until

pytestmark = pytest.mark.integration  # starts NGINX


@pytest.fixture
def nginx_alone(tmp_path: Path):
    port = free_ports(1)[0]
    argv = nginx_command(
        find_nginx({}),
        tmp_path,
        port=port,
        router_socket=tmp_path / "router.sock",
        ping_socket=tmp_path / "ping.sock",
        proxy_timeout_s=10,
        drain_timeout_s=5,
        models=["resnet"],
        max_body_bytes=1 << 20,
    )
    proc = subprocess.Popen(argv)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _answers(url), timeout=10) is not None, "NGINX never answered"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        requests.get(f"{url}/nowhere", timeout=1)
        return True
    except requests.ConnectionError:
        return False


def test_a_missing_router_is_a_json_503(nginx_alone: str):
    r = requests.post(f"{nginx_alone}/invocations", json={"modelname": "resnet"}, timeout=10)
    assert_error(r, 503, "router_unavailable")
    r = requests.post(f"{nginx_alone}/endpoints/e/invocations", json={"modelname": "resnet"}, timeout=10)
    assert_error(r, 503, "router_unavailable")


def test_a_missing_ping_server_is_a_503_naming_the_models(nginx_alone: str):
    r = requests.get(f"{nginx_alone}/ping", timeout=10)
    assert r.status_code == 503
    assert "resnet" in r.text
