"""NGINX for ``serve``: find the binary, and fill in ``nginx.conf``'s fields.

The configuration is a template: ``serve`` fills in the port, the runtime paths and sockets, the
timeouts, the body size limit, and the bodies of the answers NGINX gives by itself (those of
``app.core.errors.nginx_errors``, and the unhealthy ``/ping``), so that every error body comes
from the error classes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.core.errors import nginx_errors
from app.core.health import unhealthy
from app.core.settings import DEFAULT_MAX_BODY_BYTES, NGINX_BIN, PROJECT_ROOT

NGINX_CONF = PROJECT_ROOT / "nginx.conf"
# Characters that would end, escape or be interpolated in NGINX's single-quoted `return` text.
_UNSAFE_IN_RETURN = ("'", "$", "\\")


def _return_text(text: str) -> str:
    if any(c in text for c in _UNSAFE_IN_RETURN):
        raise ValueError(f"cannot be an NGINX return text (it holds one of {_UNSAFE_IN_RETURN}): {text}")
    return text


def render_nginx_conf(
    template: str,
    *,
    port: int,
    runtime_dir: Path,
    router_socket: Path,
    ping_socket: Path,
    proxy_timeout_s: float,
    drain_timeout_s: int,
    models: Sequence[str],
    max_body_bytes: int,
    load_timeout_s: float | None = None,
    workers: int = 1,
) -> str:
    """nginx.conf with serve's values; ``load_timeout_s`` bounds the model API's loads and
    unloads (``proxy_timeout_s`` when not given)."""
    values = {
        "PORT": str(port),
        "WORKERS": str(workers),
        "RUNTIME_DIR": str(runtime_dir),
        "ROUTER_SOCKET": str(router_socket),
        "PING_SOCKET": str(ping_socket),
        "PROXY_TIMEOUT": str(int(proxy_timeout_s)),
        "LOAD_TIMEOUT": str(int(load_timeout_s if load_timeout_s is not None else proxy_timeout_s)),
        "DRAIN_TIMEOUT": str(drain_timeout_s),
        "MAX_BODY_BYTES": str(max_body_bytes),
        # Bodies up to the real-time limit stay in memory; larger ones (asynchronous endpoints)
        # go to a file in the runtime folder rather than take a worker's memory.
        "BODY_BUFFER_BYTES": str(min(max_body_bytes, DEFAULT_MAX_BODY_BYTES)),
        "PING_UNAVAILABLE_BODY": _return_text(json.dumps(unhealthy(models), ensure_ascii=False)),
        **{f"{field}_BODY": _return_text(error.json()) for field, error in nginx_errors(max_body_bytes).items()},
    }
    for key, value in values.items():
        template = template.replace("{{" + key + "}}", value)
    if "{{" in template:
        raise ValueError(f"{NGINX_CONF} has a field serve does not fill: {template[template.index('{{') :][:40]}")
    return template


def nginx_command(binary: str, runtime_dir: Path, **fields) -> list[str]:
    """nginx.conf rendered with ``fields`` (``render_nginx_conf``'s) into ``runtime_dir``, and the
    command that runs NGINX on it in the foreground, logging to stderr."""
    conf = runtime_dir / "nginx.conf"
    conf.write_text(render_nginx_conf(NGINX_CONF.read_text(), runtime_dir=runtime_dir, **fields))
    return [binary, "-e", "stderr", "-p", str(runtime_dir), "-c", str(conf)]


def find_nginx(env: Mapping[str, str]) -> str:
    explicit = env.get(NGINX_BIN, "").strip()
    found = explicit or shutil.which("nginx", path=env.get("PATH")) or shutil.which("nginx", path="/usr/sbin")
    if not found:
        raise FileNotFoundError(
            f"nginx not found: install it (apt-get install nginx; make run does) or set {NGINX_BIN}"
        )
    return found
