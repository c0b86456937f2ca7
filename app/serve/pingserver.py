"""``serve``'s own answer to ``GET /ping``, on a unix socket that NGINX routes ``/ping`` to.

The router's threads may all be busy with long inferences; a health check that queued behind them
would get a healthy instance replaced by SageMaker. This small threaded server in the supervisor
answers at once, with the same readiness logic as the router (``app.core.health``), and says unhealthy
while the router itself is down.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from app.core.errors import NotFound
from app.core.health import HealthPolicy, Readiness, ping_answer, unhealthy


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(
        self, path: Path, triton: Readiness, health: Callable[[], HealthPolicy], router_up: Callable[[], bool]
    ):
        self.triton, self.health, self.router_up = triton, health, router_up
        super().__init__(str(path), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        if self.path != "/ping":
            status, body = 404, NotFound("this socket answers GET /ping only").body()
        elif not self.server.router_up():
            status, body = 503, unhealthy(self.server.health().served)
        else:
            status, body = ping_answer(self.server.triton, self.server.health())
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if with_body:
            self.wfile.write(data)

    def address_string(self) -> str:
        return "nginx"  # a unix socket has no peer address

    def log_message(self, format: str, *args: object) -> None:
        pass  # SageMaker pings every few seconds: not worth a log line each


def start_ping_server(
    path: Path,
    triton_url: str,
    timeout_s: float,
    ping_timeout_s: float,
    health: Callable[[], HealthPolicy],
    router_up: Callable[[], bool],
) -> _Server:
    """Serve /ping on ``path`` from a daemon thread. Call it after the children are started: the
    gRPC client it creates must not be inherited by a fork."""
    from clients.triton import TritonClient

    server = _Server(path, TritonClient(triton_url, timeout_s, ping_timeout_s), health, router_up)
    path.chmod(0o666)  # NGINX's workers run as another user; the runtime directory guards the socket
    threading.Thread(target=server.serve_forever, name="ping-server", daemon=True).start()
    return server
