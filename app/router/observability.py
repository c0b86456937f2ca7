"""What operators see of each request: Prometheus metrics, one JSON log line, a request id.

``install(app)`` wires it into the Flask app in one place: a request id is taken from the caller
(``X-Amzn-SageMaker-Inference-Id``, then ``X-Request-Id``) or made, echoed in ``X-Request-Id``; when
the request ends its counts and latencies go to the metrics and one ``app.access`` log line carries
the id, model, status and durations (never the payload).

Under gunicorn every worker is a process: with ``PROMETHEUS_MULTIPROC_DIR`` set (``serve`` sets a
fresh directory per start) the workers write their values there and ``GET /metrics`` adds them up
across workers; ``child_exit`` in ``app/router/gunicorn_conf.py`` drops a dead worker's in-flight gauge.
Without it (tests of the app in one process) the metrics live in a registry of the app's own.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from app.core.settings import PROMETHEUS_MULTIPROC_DIR
from app.router.requests import TARGET_MODEL

REQUEST_ID_HEADERS = ("X-Amzn-SageMaker-Inference-Id", "X-Request-Id")
RESPONSE_ID_HEADER = "X-Request-Id"
# A caller's id is kept only when it is short and plain; anything else gets a fresh one.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")
STAGES = ("preprocess", "triton", "postprocess")
NO_MODEL = "none"  # the model label of a request that named no served model
MIXED_MODELS = "mixed"  # ... and of a JSON Lines request whose lines name several models
# Seconds: from a tiny model's millisecond to the 30 s Triton deadline.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

access_log = logging.getLogger("app.access")
# The routes that run a model: counted in flight, measured by stage.
INVOCATION_ENDPOINTS = frozenset({"invocations", "invoke_model"})


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry  # what GET /metrics exposes
    requests: Counter
    latency: Histogram
    stages: Histogram
    in_flight: Gauge


def make_metrics() -> Metrics:
    """The router's metrics, aggregated across worker processes when ``PROMETHEUS_MULTIPROC_DIR`` is set."""
    multiprocess = bool(os.environ.get(PROMETHEUS_MULTIPROC_DIR))
    registry = CollectorRegistry()
    if multiprocess:
        MultiProcessCollector(registry)
    # In multiprocess mode the values live in the directory's files, not in a registry.
    owner = None if multiprocess else registry
    return Metrics(
        registry=registry,
        requests=Counter(
            "router_requests", "Invocations answered, by model and HTTP status.", ("model", "status"), registry=owner
        ),
        latency=Histogram(
            "router_request_duration_seconds",
            "Invocation time in the router, end to end, by model.",
            ("model",),
            buckets=BUCKETS,
            registry=owner,
        ),
        stages=Histogram(
            "router_stage_duration_seconds",
            "Invocation time by stage (preprocess, triton, postprocess) and model.",
            ("model", "stage"),
            buckets=BUCKETS,
            registry=owner,
        ),
        in_flight=Gauge(
            "router_requests_in_flight",
            "Invocations being served now, over all workers.",
            registry=owner,
            multiprocess_mode="livesum",
        ),
    )


def mark_process_dead(pid: int) -> None:
    """gunicorn's ``child_exit``: a dead worker's live gauges no longer count."""
    if os.environ.get(PROMETHEUS_MULTIPROC_DIR):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def request_id() -> str:
    for header in REQUEST_ID_HEADERS:
        value = request.headers.get(header, "").strip()
        if value and REQUEST_ID_PATTERN.fullmatch(value):
            return value
    return uuid.uuid4().hex


def install(app: Flask, metrics: Metrics | None = None) -> Metrics:
    """Request ids, metrics and the access log for every request of ``app``; ``GET /metrics``.

    The route fills ``g.model`` (the served model's name), ``g.timings`` (seconds by stage, which
    ``ModelClient.inference`` adds to) and, for errors, ``g.error_code``.
    """
    metrics = metrics or make_metrics()
    app.extensions["metrics"] = metrics

    @app.before_request
    def start() -> None:
        g.request_id = request_id()
        g.started = time.perf_counter()
        g.timings = {}
        g.model = None
        g.error_code = None
        g.invocation = request.endpoint in INVOCATION_ENDPOINTS
        if g.invocation:
            metrics.in_flight.inc()

    @app.after_request
    def finish(response: Response) -> Response:
        response.headers[RESPONSE_ID_HEADER] = g.get("request_id") or request_id()
        started = g.get("started")
        if started is None:  # a failure before start() ran: nothing to measure
            return response
        elapsed = time.perf_counter() - started
        timings: dict[str, float] = g.timings
        model = g.model or NO_MODEL
        if g.invocation:
            metrics.requests.labels(model, str(response.status_code)).inc()
            metrics.latency.labels(model).observe(elapsed)
            for stage in STAGES:
                if stage in timings:
                    metrics.stages.labels(model, stage).observe(timings[stage])
        fields: dict[str, Any] = {
            "request_id": g.request_id,
            "method": request.method,
            "path": request.path,
            "model": g.model,
            "status": response.status_code,
            "duration_ms": round(elapsed * 1000, 3),
            **{f"{stage}_ms": round(timings[stage] * 1000, 3) for stage in STAGES if stage in timings},
        }
        if g.error_code:
            fields["error"] = g.error_code
        if request.headers.get(TARGET_MODEL):  # a multi-model endpoint's TargetModel, for the logs
            fields["target_model"] = request.headers[TARGET_MODEL]
        access_log.info("%s %s %s", request.method, request.path, response.status_code, extra={"fields": fields})
        return response

    @app.teardown_request
    def done(_: BaseException | None) -> None:
        if g.pop("invocation", False):
            metrics.in_flight.dec()

    @app.get("/metrics")
    def expose() -> Response:
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    return metrics
