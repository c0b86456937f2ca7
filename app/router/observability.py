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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from app.core import access
from app.core.family import Family
from app.core.settings import PROMETHEUS_MULTIPROC_DIR
from app.router.parsing import TARGET_MODEL
from clients.families import FAMILIES

REQUEST_ID_HEADERS = ("X-Amzn-SageMaker-Inference-Id", "X-Request-Id")
RESPONSE_ID_HEADER = "X-Request-Id"
# A caller's id is kept only when it is short and plain; anything else gets a fresh one.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")
STAGES = access.STAGES
_STAGE_FIELDS = {stage: access.stage_field(stage) for stage in STAGES}  # "triton" -> "triton_ms"
NO_MODEL = "none"  # the model label of a request that named no served model
MIXED_MODELS = "mixed"  # ... and of a JSON Lines request whose lines name several models
# Seconds: from a tiny model's millisecond to the 30 s Triton deadline.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

access_log = logging.getLogger(access.LOGGER)
# POST /models/<name>/invoke (multi-model endpoints), beside POST /invocations.
INVOKE_PATH = re.compile(r"/models/[^/]+/invoke")


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry  # what GET /metrics exposes
    requests: Counter
    latency: Histogram
    stages: Histogram
    in_flight: Gauge
    # The families' own counts (app.core.family.Counter), by their timings' key: a count per model.
    counts: Mapping[str, Counter]
    # ... and their own distributions (app.core.family.Measure): a histogram per model.
    measures: Mapping[str, Histogram] = field(default_factory=dict)


def make_metrics(families: Mapping[str, Family] = FAMILIES) -> Metrics:
    """The router's metrics, aggregated across worker processes when ``PROMETHEUS_MULTIPROC_DIR`` is set;
    besides the router's own, each count a family declares."""
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
        counts={
            count.key: Counter(count.metric, count.help, ("model",), registry=owner)
            for count in {count.key: count for family in families.values() for count in family.counters}.values()
        },
        measures={
            measure.key: Histogram(measure.metric, measure.help, ("model",), buckets=measure.buckets, registry=owner)
            for measure in {m.key: m for family in families.values() for m in family.measures}.values()
        },
    )


def mark_process_dead(pid: int) -> None:
    """gunicorn's ``child_exit``: a dead worker's live gauges no longer count."""
    if os.environ.get(PROMETHEUS_MULTIPROC_DIR):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


# The WSGI environ keys of REQUEST_ID_HEADERS.
_REQUEST_ID_KEYS = tuple("HTTP_" + header.upper().replace("-", "_") for header in REQUEST_ID_HEADERS)
_TARGET_MODEL_KEY = "HTTP_" + TARGET_MODEL.upper().replace("-", "_")
TRACE_KEY = "app.router.trace"  # where a request's Trace lives in its WSGI environ


def request_id(environ: Mapping[str, Any]) -> str:
    """The caller's id (``X-Amzn-SageMaker-Inference-Id``, then ``X-Request-Id``) when it is short
    and plain, else a fresh one."""
    for key in _REQUEST_ID_KEYS:
        value = environ.get(key, "").strip()
        if value and REQUEST_ID_PATTERN.fullmatch(value):
            return value
    return uuid.uuid4().hex


@dataclass(slots=True)
class Trace:
    """What the route tells observability about its request: the served model's name, seconds by
    stage (``ModelClient.run`` adds to them) and, for an error, its code."""

    request_id: str
    model: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error_code: str | None = None
    # A streamed answer (app.router.streaming): the request is recorded when its body ends, not
    # when the route returns.
    streamed: bool = False


# /invocations, and the local stack's answer to boto3's response stream (app/router/event_stream.py)
INVOCATION_PATHS = ("/invocations", "/invocations-response-stream")


def current() -> Trace:
    """The Trace of the request being served."""
    return request.environ[TRACE_KEY]


def is_invocation(method: str, path: str) -> bool:
    """The routes that run a model: counted in flight, measured by stage."""
    return method == "POST" and (path in INVOCATION_PATHS or INVOKE_PATH.fullmatch(path) is not None)


class Observed:
    """WSGI middleware around the Flask app: the request id (echoed in ``X-Request-Id``), and when
    the answer is ready its counts and latencies in the metrics and one ``app.access`` line.

    It works on the WSGI environ and the status line alone (no request objects, no Flask hooks):
    it runs for every request, so it costs as little as it can."""

    def __init__(self, app: Any, metrics: Metrics, endpoint: str = "") -> None:
        self.app = app
        self.metrics = metrics
        self.endpoint = endpoint  # on every line when set: the endpoint's name (ENDPOINT_NAME)
        self._requests: dict[tuple[str, str], Any] = {}  # labelled metrics, made once per label set
        self._latency: dict[str, Any] = {}
        self._stages: dict[tuple[str, str], Any] = {}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        started = time.perf_counter()
        trace = environ[TRACE_KEY] = Trace(request_id(environ))
        invocation = is_invocation(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
        answered: list[str] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            answered.append(status)
            headers.append((RESPONSE_ID_HEADER, trace.request_id))
            return start_response(status, headers, exc_info)

        def finish() -> None:
            if invocation:
                self.metrics.in_flight.dec()
            status = int(answered[-1].split(" ", 1)[0]) if answered else 500
            self._record(environ, trace, status, time.perf_counter() - started, invocation)

        if invocation:
            self.metrics.in_flight.inc()
        body = None
        try:
            body = self.app(environ, start)
        finally:
            if body is None or not trace.streamed:
                finish()
        return Recorded(body, finish) if trace.streamed else body

    def _record(self, environ: Mapping[str, Any], trace: Trace, status: int, elapsed: float, invocation: bool) -> None:
        model, timings = trace.model or NO_MODEL, trace.timings
        if invocation:
            key = (model, str(status))
            counter = self._requests.get(key) or self._requests.setdefault(key, self.metrics.requests.labels(*key))
            counter.inc()
            latency = self._latency.get(model) or self._latency.setdefault(model, self.metrics.latency.labels(model))
            latency.observe(elapsed)
            for stage in STAGES:
                if stage in timings:
                    histogram = self._stages.get((model, stage))
                    if histogram is None:
                        histogram = self._stages.setdefault((model, stage), self.metrics.stages.labels(model, stage))
                    histogram.observe(timings[stage])
            for key, count in self.metrics.counts.items():
                if key in timings:
                    count.labels(model).inc(timings[key])
            for key, histogram in self.metrics.measures.items():
                if key in timings:
                    histogram.labels(model).observe(timings[key])
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        # The field names are app.core.access's: CloudWatch's metric filters read the same ones.
        fields: dict[str, Any] = {access.REQUEST_ID: trace.request_id, access.METHOD: method, access.PATH: path}
        if trace.model:
            fields[access.MODEL] = trace.model
        fields[access.STATUS] = status
        fields[access.DURATION_MS] = round(elapsed * 1000, 3)
        for stage in STAGES:
            if stage in timings:
                fields[_STAGE_FIELDS[stage]] = round(timings[stage] * 1000, 3)
        for key in self.metrics.counts:
            if key in timings:
                fields[key] = int(timings[key])
        for key in self.metrics.measures:
            if key in timings and key not in fields:
                fields[key] = round(timings[key], 4)
        if trace.error_code:
            fields[access.ERROR] = trace.error_code
        target = environ.get(_TARGET_MODEL_KEY)
        if target:  # a multi-model endpoint's TargetModel
            fields[access.TARGET_MODEL] = target
        if self.endpoint:
            fields[access.ENDPOINT] = self.endpoint
        access_log.info("%s %s %s", method, path, status, extra={"fields": fields})


class Recorded:
    """A streamed body (``Trace.streamed``) whose request is recorded when the server closes it: its
    last chunk sent, or the caller gone."""

    def __init__(self, body: Any, finish: Any) -> None:
        self.body = body
        self.finish = finish

    def __iter__(self) -> Any:
        return iter(self.body)

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.finish()


def install(app: Flask, metrics: Metrics | None = None, endpoint: str = "") -> Metrics:
    """Request ids, metrics and the access log for every request of ``app`` (``Observed``, around
    its WSGI app; ``endpoint`` on every access line when given); ``GET /metrics``. The route fills
    its ``current()`` Trace."""
    metrics = metrics or make_metrics()
    app.extensions["metrics"] = metrics
    app.wsgi_app = Observed(app.wsgi_app, metrics, endpoint)

    @app.get("/metrics")
    def expose() -> Response:
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    return metrics
