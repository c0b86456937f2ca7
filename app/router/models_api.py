"""SageMaker's multi-model container API, with ``SAGEMAKER_MULTI_MODEL=true``.

- ``POST /models`` ``{"model_name", "url"}``: link the model's folders into Triton's repository
  under names of its own (``app.core.model_store.triton_names``: archives holding the same folder
  names load side by side), load them (steps before ensembles) and register the model: 200; 409
  when the name is loaded or being loaded; 404 when ``url`` holds no model; 400 for a bad layout,
  ``config.pbtxt`` or ``model.toml``; 507 when the instance has not the memory (checked before
  loading; Triton's out-of-memory failure too); 504 past ``MODEL_LOAD_TIMEOUT``.
- ``GET /models`` (``next_page_token``, ``max_results``), ``GET /models/<name>``.
- ``DELETE /models/<name>``: new requests get 404 at once; those in flight finish first.
- ``POST /models/<name>/invoke``: what ``/invocations`` takes (our envelope, whose ``modelname``
  the path replaces; a raw body; KServe v2, passed to the model's Triton model). So that
  ``invoke.py --target-model`` works against a local stack as against SageMaker (which turns
  ``TargetModel`` into this path), ``/invocations`` with ``X-Amzn-SageMaker-Target-Model: <name>``
  answers the same. Both are ``app.router``'s routes, beside ``/invocations``.

This module only maps HTTP onto ``clients.multimodel.MultiModelStore``, which does the work.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, Response, request

from app.core.errors import InvalidInput, NotFound
from app.core.model_store import LOADED, Record
from app.core.settings import MIB, MULTI_MODEL
from app.router.handlers import json_response
from app.router.observability import current
from app.router.parsing import TARGET_MODEL, parse_json_object
from clients.multimodel import MultiModelStore

log = logging.getLogger("app.router")

DEFAULT_PAGE = 100


def _page(records: list[Record], token: str, size: str) -> dict[str, Any]:
    try:
        start = int(token or 0)
        count = int(size or DEFAULT_PAGE)
    except ValueError:
        raise InvalidInput("next_page_token and max_results must be whole numbers") from None
    if start < 0 or count < 1:
        raise InvalidInput("next_page_token must be >= 0 and max_results >= 1")
    page: dict[str, Any] = {"models": [r.listing() for r in records[start : start + count]]}
    if start + count < len(records):
        page["nextPageToken"] = str(start + count)
    return page


def register(app: Flask, models: MultiModelStore | None) -> None:
    """The ``/models`` routes (their ``/invoke`` is ``app.router``'s, beside ``/invocations``): SageMaker's
    API in multi-model mode (``models``), a 404 that says how to turn it on otherwise."""
    if models is None:

        @app.route("/models", methods=["GET", "POST"])
        @app.route("/models/<path:_>", methods=["GET", "POST", "DELETE"])
        def models_off(_: str = "") -> Response:
            raise NotFound(
                f"the model API is for multi-model endpoints ({MULTI_MODEL}=true); this endpoint serves "
                "its models on POST /invocations"
            )

        return

    @app.post("/models")
    def load_model() -> Response:
        body = parse_json_object(request.get_data(cache=False))
        name, url = body.get("model_name"), body.get("url")
        for key, value in (("model_name", name), ("url", url)):
            if not isinstance(value, str) or not value.strip():
                raise InvalidInput(f"{key} must be a non-empty string")
        current().model = name
        started = time.monotonic()
        record = models.load(name, url)
        log.info(
            "loaded model %s from %s (%s) in %.1f s: files %.1f MiB, Triton grew by %.1f MiB",
            name,
            url,
            request.headers.get(TARGET_MODEL, "-"),
            time.monotonic() - started,
            record.size_bytes / MIB,
            record.memory_bytes / MIB,
        )
        return json_response({"status": f"model {name!r} loaded", **record.listing()})

    @app.get("/models")
    def list_models() -> Response:
        return json_response(
            _page(models.store.loaded(), request.args.get("next_page_token", ""), request.args.get("max_results", ""))
        )

    @app.get("/models/<name>")
    def get_model(name: str) -> Response:
        record = models.store.get(name)
        if record is None or record.state != LOADED:
            raise NotFound(f"model {name!r} is not loaded")
        return json_response(record.listing())

    @app.delete("/models/<name>")
    def unload_model(name: str) -> Response:
        current().model = name
        models.unload(name)
        log.info("unloaded model %s (%s)", name, request.headers.get(TARGET_MODEL, "-"))
        return json_response({"status": f"model {name!r} unloaded"})
