"""The container's own JSON error, kept and printed: what SageMaker wraps in a ModelError, or what the
local stack answers as it is (botocore drops the body of an error it cannot parse)."""

from __future__ import annotations

import json
from typing import Any

RAW_ERROR_BODY = "RawErrorBody"


def keep_error_bodies(client, operation: str) -> None:
    """The container's own JSON error kept on a failed ``operation`` (``error_lines`` prints it)."""
    client.meta.events.register(
        f"before-parse.{client.meta.service_model.service_id.hyphenize()}.{operation}",
        _keep_error_body,
        unique_id=f"invoke-keep-error-body-{operation}",
    )


def _keep_error_body(response_dict, customized_response_dict, **_) -> None:
    """botocore drops the body of an error it cannot parse (the local stack's own JSON): keep it."""
    if response_dict.get("status_code", 200) >= 400:
        customized_response_dict[RAW_ERROR_BODY] = response_dict.get("body", b"")


def error_lines(model: str, error) -> list[str]:
    """The container's own JSON error: SageMaker wraps it in a ModelError; the local stack sends it as is."""
    response = error.response
    status = response.get("OriginalStatusCode") or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    body = response.get("OriginalMessage")  # a ModelError: what the container answered
    if body is None:
        raw = response.get(RAW_ERROR_BODY)
        body = raw.decode(errors="replace") if raw else response.get("Error", {}).get("Message", "")
    code = response.get("Error", {}).get("Code", "")
    label = f"status {status}" + (f" ({code})" if code and code != str(status) else "")
    return failure_lines(f"{model}: failed with {label}", body)


def failure_lines(heading: str, body: Any) -> list[str]:
    """The heading, then the body indented: pretty JSON when it is JSON."""
    try:
        body = json.dumps(json.loads(body), indent=2)
    except (TypeError, ValueError):
        pass
    return [heading, *("  " + line for line in str(body).splitlines())]
