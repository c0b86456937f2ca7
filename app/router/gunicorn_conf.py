"""gunicorn settings for the router: threaded workers, each building its app after the fork.

Environment: ``GUNICORN_BIND`` (``serve`` sets ``unix:<dir>/router.sock``), ``MODEL_SERVER_WORKERS``,
``MODEL_SERVER_THREADS``, ``MODEL_SERVER_TIMEOUT``, ``LOG_LEVEL`` (see ``app/core/settings.py``).
"""

import os

from gunicorn.glogging import Logger

from app.core.logs import logging_config
from app.core.settings import Settings
from app.router.observability import mark_process_dead

_settings = Settings.from_env()

wsgi_app = "app.router.wsgi:app"
bind = [_settings.router_bind]
worker_class = "gthread"
workers = _settings.workers
threads = _settings.threads
preload_app = False  # the gRPC client must be created after the fork
timeout = int(_settings.server_timeout_s) + 30  # above MODEL_SERVER_TIMEOUT: NGINX cuts first
graceful_timeout = 25  # SIGTERM: requests in flight get 25 s (SageMaker kills at 30 s)
# A connection per request from NGINX: an idle kept-alive connection to a worker that was killed,
# or that gunicorn closes after its keep-alive seconds just as NGINX reuses it, answers that
# request with a 502 (NGINX does not retry a POST). On the unix socket a new connection costs little.
keepalive = 0
accesslog = None  # each request is one JSON line from app.access (app/router/observability.py) instead


class RouterLogger(Logger):
    """gunicorn's logger without its access line: with a logging config given, gunicorn would build
    that line's fields for every request only for the dropped ``gunicorn.access`` logger."""

    def access(self, resp, req, environ, request_time) -> None:
        return None


logger_class = RouterLogger
errorlog = "-"
loglevel = _settings.log_level.lower()
logconfig_dict = logging_config(_settings.log_level)
# gunicorn's control socket lives at one per-user path; several stacks on a machine would share it.
control_socket_disable = True
# Each worker's heartbeat touches a file at every turn of its loop: in memory, not on disk.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None


def child_exit(server, worker) -> None:
    """A worker that exited (or was killed) no longer counts in the in-flight gauge of /metrics."""
    mark_process_dead(worker.pid)
