"""The Flask router: SageMaker's ``GET /ping`` and ``POST /invocations`` in front of Triton.

``create_app(settings, registry, triton)`` is the application factory (tests hand it fakes); it
only wires: parsing is ``app.router.parsing`` (no Flask), the error bodies ``app.router.handlers``,
metrics and logs ``app.router.observability``, running the parsed calls ``app.router.batches``.
Besides the contract's two paths it answers ``GET /execution-parameters`` (Batch Transform's
question), ``GET /openapi.json`` (the contract as OpenAPI 3, built from the model families at
start: ``app.router.openapi``), ``GET /metrics`` and, for local use, OpenAI's ``/v1/chat/completions``,
``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` (``app.router.openai_paths``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from flask import Flask, Response, request

from app.core.errors import InvalidInput
from app.core.health import health_policy, ping_answer
from app.core.settings import Settings
from app.router.accept import answer_type
from app.router.batches import run_invocations
from app.router.event_stream import as_payload_parts
from app.router.generation_forms import is_generation_body, parse_body, parse_streamed_envelope, streams
from app.router.handlers import json_bytes, json_response, register_error_handlers
from app.router.models_api import register as register_multi_model
from app.router.observability import MIXED_MODELS, current
from app.router.observability import install as install_observability
from app.router.openai_paths import EmbeddingAsk
from app.router.openai_paths import register as register_openai
from app.router.openapi import openapi_document
from app.router.parsing import (
    BINARY_JSON_TYPE,
    CUSTOM_ATTRIBUTES,
    JSON_HEADER_SIZE,
    JSON_TYPE,
    TARGET_MODEL,
    Request,
    Served,
    check_media_type,
    is_jsonlines,
    is_v2,
    parse_custom_attributes,
    parse_envelope,
    parse_invocation,
    parse_json_object,
    parse_lines,
    pass_through,
)
from app.router.streaming import answer_generation
from clients.base import ModelClient, timed
from clients.families import FAMILIES, build_registry
from clients.kserve import TritonHttp
from clients.multimodel import MultiModelStore
from clients.sentence_embedding import SentenceEmbeddingClient
from clients.serving import Model, Registry
from clients.triton import TritonClient
from clients.v2_checks import check_request


def create_app(
    settings: Settings | None = None, registry: Mapping[str, ModelClient] | None = None, triton: Any = None
) -> Flask:
    """The router. ``registry`` maps model names to clients (built from the settings' model
    repository when not given); ``triton`` answers readiness (and inference, for a built registry)."""
    settings = settings or Settings.from_env()
    triton = triton if triton is not None else TritonClient.from_settings(settings)
    kserve = TritonHttp.from_settings(settings)
    if registry is None:  # in multi-model mode, SageMaker's loads bring the models (clients.multimodel)
        registry = {} if settings.multi_model else build_registry(settings.model_repository, triton, settings)
    health = health_policy(settings, {name: client.spec for name, client in registry.items()})
    served_models = Registry(registry)
    loaded_models = MultiModelStore(settings, triton, kserve) if settings.multi_model else None

    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["SETTINGS"] = settings
    app.extensions["registry"] = registry
    app.extensions["triton"] = triton
    install_observability(app, endpoint=settings.endpoint_name)
    register_error_handlers(app, settings)
    openapi = json_bytes(openapi_document(FAMILIES, settings.max_batch_items))

    def lookup(name: Any) -> ModelClient:
        client = served_models.client(name)
        current().model = client.name  # from here on, observability labels the request (errors too) with it
        return client

    served = Served(lookup, served_models.content_types)

    def generation_models() -> list[str]:
        """The models of a family that streams its tokens (text_generation) served: one answers a TGI
        or chat body that names none."""
        return [name for name, client in registry.items() if FAMILIES[client.family].streams]

    @app.get("/ping")
    def ping() -> Response:
        status, body = ping_answer(triton, health())
        return json_response(body, status)

    @app.get("/openapi.json")
    def openapi_description() -> Response:
        return Response(openapi, mimetype=JSON_TYPE)

    @app.get("/execution-parameters")
    def execution_parameters() -> Response:
        return json_response(settings.execution_parameters())

    def incoming() -> Request:
        return Request(
            body=request.get_data(cache=False),
            mimetype=request.mimetype or JSON_TYPE,
            mimetype_params=request.mimetype_params,
            custom_attributes=request.headers.get(CUSTOM_ATTRIBUTES, ""),
            accept=request.headers.get("Accept", ""),
            target_model=request.headers.get(TARGET_MODEL, ""),
            content_type=request.headers.get("Content-Type", ""),
        )

    def answer(served: Served, parsed: Mapping[str, Any] | None = None) -> Response:
        """The answer to an invocation of the model(s) ``served`` stands for; ``parsed``: its JSON body,
        already parsed (OpenAI's paths check it first)."""
        deadline = time.monotonic() + settings.server_timeout_s
        asked = incoming()
        check_media_type(asked, served.content_types)
        json_body = asked.mimetype == JSON_TYPE
        document = (parse_json_object(asked.body) if parsed is None else parsed) if json_body else None
        if asked.mimetype == BINARY_JSON_TYPE or (document is not None and is_v2(document)):
            return passed_to_triton(
                replace(asked, target_model=served.v2_model) if served.v2_model else asked, document, served.load
            )
        if document is not None and is_generation_body(document):  # TGI's or OpenAI's chat body
            attributes = parse_custom_attributes(asked.custom_attributes)
            with timed(current().timings, "preprocess"):
                names = (lambda: [served.only]) if served.only else generation_models
                call = parse_body(document, attributes, served.lookup, names)
            return answer_generation(call, deadline, current())
        lines = is_jsonlines(asked)
        calls = parse_lines(asked, served.lookup) if lines else [parse_invocation(asked, served.lookup, document)]
        if not lines and streams(calls[0].client, calls[0].payload):
            with timed(current().timings, "preprocess"):
                call = parse_streamed_envelope(calls[0].client, calls[0].payload, calls[0].version)
            return answer_generation(call, deadline, current())
        kind = answer_type(asked)
        if len({call.client.name for call in calls}) > 1:
            current().model = MIXED_MODELS
        answers = run_invocations(calls, numbered=lines, timings=current().timings, deadline=deadline)
        if kind == JSON_TYPE:
            return json_response(answers if lines else answers[0])
        return Response(b"".join(json_bytes(a) + b"\n" for a in answers), mimetype=kind)

    def answer_loaded(name: str) -> Response:
        """The answer of the loaded model ``name`` (multi-model mode), held against unloads meanwhile."""
        current().model = name
        with loaded_models.serving(name) as model:
            return answer(served_by(model))

    @app.post("/invocations")
    def invocations() -> Response:
        target = request.headers.get(TARGET_MODEL, "")
        if loaded_models is not None and target:  # what SageMaker sends /models/<name>/invoke, called locally
            return answer_loaded(target)
        return answer(served)

    @app.post("/invocations-response-stream")
    def invocations_response_stream() -> Response:
        """boto3's invoke_endpoint_with_response_stream against the local stack (NGINX rewrites its
        path here): the answer to /invocations, in SageMaker's PayloadPart events."""
        return as_payload_parts(invocations(), settings.local_stream_part_bytes)

    if loaded_models is not None:

        @app.post("/models/<name>/invoke")
        def invoke_model(name: str) -> Response:
            return answer_loaded(name)

    def passed_to_triton(asked: Request, document: Any, load: object) -> Response:
        """A KServe v2 body, checked against the model's configuration (nothing unchecked reaches
        Triton), then answered as AWS's SageMaker Triton image answers it: Triton's own answer."""
        call = pass_through(asked, settings.default_model_name, document)
        trace = current()
        trace.model = trace.model or call.model
        with timed(trace.timings, "preprocess"):  # the check is all the router does before Triton
            check_request(call.header, kserve.contract(call.model, load), call.binary, settings.max_body_bytes)
        with timed(trace.timings, "triton"):
            answer = kserve.infer(call.model, call.body, call.json_size)
        if answer.json_size is None:
            return Response(answer.body, mimetype=JSON_TYPE)
        return Response(answer.body, content_type=f"{BINARY_JSON_TYPE};{JSON_HEADER_SIZE}={answer.json_size}")

    def embedded(ask: EmbeddingAsk) -> tuple[list[list[float]], int]:
        """``/v1/embeddings``: the envelope's answer to ``{"text": input}`` of a sentence_embedding model,
        and the tokens the model read."""
        client = lookup(ask.model)
        if not isinstance(client, SentenceEmbeddingClient):
            raise InvalidInput(
                f"model {ask.model!r} is a {client.family} model: /v1/embeddings is for "
                f"{SentenceEmbeddingClient.family} models"
            )
        call = parse_envelope({"modelname": ask.model, "payload": {"text": list(ask.texts)}}, served.lookup)
        deadline = time.monotonic() + settings.server_timeout_s
        [found] = run_invocations([call], numbered=False, timings=current().timings, deadline=deadline)
        return found["result"], sum(client.token_count(text) for text in ask.texts)

    register_multi_model(app, loaded_models)
    if loaded_models is None:  # OpenAI's paths name one served model each call: a single-model endpoint's
        families = {name: client.family for name, client in registry.items()}
        register_openai(app, lambda document: answer(served, document), embedded, lambda: families)
    return app


def served_by(model: Model) -> Served:
    """What answers an invocation of one model (a loaded one): its client whatever the envelope names,
    its Triton model for a KServe v2 body."""

    def lookup(_: Any) -> ModelClient:
        if model.client is None:
            raise InvalidInput(
                f"model {model.name!r} is a Triton model without a model.toml: send it KServe v2 "
                'tensors (application/json with "inputs", or binary+json)'
            )
        return model.client

    return Served(lookup, model.content_types, model.triton_name, model.load, only=model.name)
