"""Every error body comes from the error classes: the router's, the ping server's and NGINX's own."""

from __future__ import annotations

import json
import re
import socket

import pytest

from app.core import errors
from app.core.health import HealthPolicy, unhealthy
from app.core.settings import DEFAULT_MAX_BODY_BYTES
from app.serve.nginx import NGINX_CONF, render_nginx_conf
from app.serve.pingserver import start_ping_server

# The contract's table (docs/reference/api.md): each class's status and code.
CLASSES = [
    (errors.InvalidJson, 400, "invalid_json"),
    (errors.InvalidInput, 400, "invalid_input"),
    (errors.NotFound, 404, "not_found"),
    (errors.UnknownModel, 404, "unknown_model"),
    (errors.MethodNotAllowed, 405, "method_not_allowed"),
    (errors.PayloadTooLarge, 413, "payload_too_large"),
    (errors.UnsupportedMediaType, 415, "unsupported_media_type"),
    (errors.ModelNotReady, 503, "model_not_ready"),
    (errors.RouterUnavailable, 503, "router_unavailable"),
    (errors.TritonUnavailable, 503, "triton_unavailable"),
    (errors.InferenceTimeout, 504, "inference_timeout"),
]
MODELS = ("resnet", "bert_base")


def rendered(models=MODELS, max_body_bytes=DEFAULT_MAX_BODY_BYTES) -> str:
    return render_nginx_conf(
        NGINX_CONF.read_text(),
        port=8080,
        runtime_dir="/run/x",
        router_socket="/run/x/r.sock",
        ping_socket="/run/x/p.sock",
        proxy_timeout_s=65,
        drain_timeout_s=24,
        models=models,
        max_body_bytes=max_body_bytes,
    )


@pytest.mark.parametrize(("cls", "status", "code"), CLASSES, ids=[c[2] for c in CLASSES])
def test_each_class_body(cls, status, code):
    error = cls("what went wrong")
    assert (error.status, error.code) == (status, code)
    assert error.body() == {"error": {"code": code, "message": "what went wrong"}}
    assert json.loads(error.json()) == error.body()


def test_internal_error_names_only_its_id():
    internal = errors.InternalError("abc123")
    assert (internal.status, internal.error_id) == (500, "abc123")
    assert internal.body() == {"error": {"code": "internal_error", "message": "internal error; its id is abc123"}}


def test_an_unmapped_status_gets_a_code_from_its_name():
    teapot = errors.ApiError.for_status(418, "I'm a Teapot", "short and stout")
    assert (teapot.status, teapot.code) == (418, "i_m_a_teapot")
    assert teapot.body() == {"error": {"code": "i_m_a_teapot", "message": "short and stout"}}
    assert errors.ApiError.for_status(499, "", "x").code == "error"
    assert errors.ApiError("x").code == "internal_error"  # the class itself is left as it was


def test_the_http_statuses_map_onto_the_classes():
    assert {status: cls.status for status, cls in errors.HTTP_STATUS_ERRORS.items()} == {
        status: status for status in errors.HTTP_STATUS_ERRORS
    }


def test_nginx_answers_with_the_classes_bodies():
    conf = rendered()
    answers = re.findall(r"return (\d{3}) '(\{.*\})';", conf)
    expected = [(str(e.status), e.json()) for e in errors.nginx_errors(DEFAULT_MAX_BODY_BYTES).values()]
    expected.append(("503", json.dumps(unhealthy(MODELS), ensure_ascii=False)))
    assert sorted(answers) == sorted(expected)
    assert {e.code for e in errors.nginx_errors(DEFAULT_MAX_BODY_BYTES).values()} == {
        "method_not_allowed",
        "not_found",
        "payload_too_large",
        "router_unavailable",
    }
    assert "{{" not in conf


def test_nginx_limit_and_its_413_name_the_same_bytes():
    assert DEFAULT_MAX_BODY_BYTES == 6 * 1024 * 1024
    assert errors.nginx_errors(DEFAULT_MAX_BODY_BYTES)["PAYLOAD_TOO_LARGE"].message.startswith(
        "request body is over 6 MiB (6291456 bytes), the limit MAX_BODY_BYTES sets"
    )
    conf = rendered()
    assert "client_max_body_size 6291456;" in conf
    assert "client_body_buffer_size 6291456;" in conf


def test_a_raised_limit_reaches_nginx_and_its_413_but_not_the_memory_buffer():
    conf = rendered(max_body_bytes=64 * 1024 * 1024)
    assert "client_max_body_size 67108864;" in conf
    assert "client_body_buffer_size 6291456;" in conf  # larger bodies are buffered in a file
    answers = dict(re.findall(r"return (413) '(\{.*\})';", conf))
    assert "over 64 MiB (67108864 bytes)" in json.loads(answers["413"])["error"]["message"]


def test_the_ping_fallback_names_every_model_unknown():
    assert unhealthy(MODELS) == {"status": "unhealthy", "models": {"resnet": "UNKNOWN", "bert_base": "UNKNOWN"}}
    assert 'return 503 \'{"status": "unhealthy", "models": {}}\';' in rendered(models=())


@pytest.mark.parametrize("name", ["it's", "a$b", "back\\slash"])
def test_a_body_that_would_break_the_quotes_is_refused(name):
    with pytest.raises(ValueError, match="NGINX return text"):
        rendered(models=(name,))


def get(path, url: str) -> tuple[int, dict]:
    """A GET over the ping server's unix socket: (status, JSON body)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(str(path))
        conn.sendall(f"GET {url} HTTP/1.0\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_the_ping_server_answers_with_the_same_bodies(tmp_path):
    path = tmp_path / "ping.sock"
    health = HealthPolicy({m: (m,) for m in MODELS})
    server = start_ping_server(path, "127.0.0.1:1", 1.0, 0.5, lambda: health, router_up=lambda: False)
    try:
        assert get(path, "/nope") == (404, errors.NotFound("this socket answers GET /ping only").body())
        assert get(path, "/ping") == (503, unhealthy(MODELS))
    finally:
        server.shutdown()
        server.server_close()
