"""The router's access line: its logger and field names, in one place.

``app/router/observability.py`` writes one JSON line per request with these fields; the CloudWatch
metric filters, dashboard and Logs Insights queries that ``python -m scripts.sagemaker deploy``
makes (``scripts/sagemaker/model_metrics.py``) read the same names from here, so a field renamed in
the router renames it in every filter too. A field is on the line only when it has a value (no
``null``): a metric filter's ``$.model = *`` then means "this request named a served model".
"""

from __future__ import annotations

LOGGER = "app.access"  # the logger's name, the line's "logger" field
LOGGER_FIELD = "logger"
REQUEST_ID = "request_id"
METHOD = "method"
PATH = "path"
MODEL = "model"  # the served model's name; absent when the request named none
STATUS = "status"  # the HTTP status, a number
DURATION_MS = "duration_ms"  # the whole request in the router, milliseconds
ERROR = "error"  # an error's code
TARGET_MODEL = "target_model"  # a multi-model endpoint's TargetModel (its archive's name)
ENDPOINT = "endpoint"  # the endpoint's name, when the container was told it (ENDPOINT_NAME)
STAGES = ("preprocess", "triton", "postprocess")
# A text2text request's tokens generated (a count, carried beside the stages' seconds): the line's
# field, and the router's counter router_generated_tokens{model} (its rate is tokens per second).
GENERATED_TOKENS = "generated_tokens"
# A mask_generation or grounded_segmentation request's masks answered (router_masks{model}), and a
# zero_shot_object_detection or grounded_segmentation request's detections (router_detections{model}).
MASKS = "masks"
DETECTIONS = "detections"
# A text_generation request's seconds to its first token, its tokens per second after it, and a
# generation whose caller went away (router_generation_cancelled_total{model}).
TIME_TO_FIRST_TOKEN = "time_to_first_token_s"
TOKENS_PER_SECOND = "tokens_per_second"
GENERATION_CANCELLED = "generation_cancelled"
# A text_generation chat answer's tool calls (router_tool_calls_total{model}), and a request whose answer
# kept to a grammar: a JSON Schema, a regex, a call the model had to make (router_constrained_requests_total).
TOOL_CALLS = "tool_calls"
CONSTRAINED = "constrained"


def stage_field(stage: str) -> str:
    """The field of a stage's milliseconds: ``triton`` -> ``triton_ms``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    return f"{stage}_ms"
