"""Check a response against app/router/openapi.json: its status is documented for the path, and its body
matches the schema documented for that status and content type."""

from __future__ import annotations

import json
from functools import lru_cache

import jsonschema_rs
import requests

from app.router import OPENAPI_PATH


@lru_cache(maxsize=1)
def description() -> dict:
    return json.loads(OPENAPI_PATH.read_text())


@lru_cache(maxsize=None)
def _validator(schema_json: str):
    # The OpenAPI 3.0 schema objects used here are plain JSON Schema; refs resolve within the document.
    return jsonschema_rs.validator_for({**json.loads(schema_json), "components": description()["components"]})


def assert_conforms(r: requests.Response, path: str, method: str) -> None:
    responses = description()["paths"][path][method.lower()]["responses"]
    documented = responses.get(str(r.status_code))
    assert documented is not None, f"{method} {path}: status {r.status_code} is not documented: {r.text[:200]}"
    media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
    content = documented.get("content", {})
    assert media_type in content, f"{method} {path} {r.status_code}: {media_type} is not documented"
    schema = content[media_type]["schema"]
    if media_type == "application/json":
        body = r.json()
        errors = [e.message for e in _validator(json.dumps(schema, sort_keys=True)).iter_errors(body)]
        assert not errors, f"{method} {path} {r.status_code}: {errors} in {r.text[:300]}"
