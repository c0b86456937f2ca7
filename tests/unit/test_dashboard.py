"""The per-model dashboard's body, for every kind of endpoint: valid against CloudWatch's dashboard
body structure (a JSON Schema of the documented widget and metric-array fields below), laid out on
the 24-column grid without overlaps, and every metric it graphs is one that a metric filter
publishes (namespace, name, the EndpointName and Model dimensions) or one that SageMaker publishes
under the dimensions given."""

from __future__ import annotations

import json
import re
from itertools import combinations

import jsonschema_rs
import pytest

from scripts.sagemaker.dashboard import SAGEMAKER_METRICS, dashboard_body
from scripts.sagemaker.model_metrics import (
    COMPONENTS,
    FORMS,
    MULTI_MODEL,
    NAMESPACE,
    REAL_TIME,
    MetricsConfig,
    metric_filters,
)

REGION = "eu-west-1"
STAT = r"^(SampleCount|Average|Sum|Minimum|Maximum|p\d{1,2}(\.\d+)?|p100)$"
# CloudWatch's "Dashboard Body Structure and Syntax": the fields of a body, a widget and a metric
# widget's properties and metric arrays that the dashboard uses (anything else is refused here).
METRIC_OPTIONS = {
    "type": "object",
    "properties": {
        "stat": {"type": "string", "pattern": STAT},
        "label": {"type": "string"},
        "period": {"type": "integer"},
        "color": {"type": "string"},
        "yAxis": {"enum": ["left", "right"]},
        "visible": {"type": "boolean"},
        "id": {"type": "string"},
    },
    "additionalProperties": False,
}
SCHEMA = {
    "type": "object",
    "required": ["widgets"],
    "properties": {
        "widgets": {
            "type": "array",
            "minItems": 1,
            "maxItems": 500,
            "items": {
                "type": "object",
                "required": ["type", "x", "y", "width", "height", "properties"],
                "properties": {
                    "type": {"enum": ["metric", "text"]},
                    "x": {"type": "integer", "minimum": 0, "maximum": 23},
                    "y": {"type": "integer", "minimum": 0},
                    "width": {"type": "integer", "minimum": 1, "maximum": 24},
                    "height": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "properties": {"type": "object"},
                },
                "additionalProperties": False,
                "allOf": [
                    {
                        "if": {"properties": {"type": {"const": "metric"}}},
                        "then": {
                            "properties": {
                                "properties": {
                                    "type": "object",
                                    "required": ["metrics", "region", "view"],
                                    "properties": {
                                        "metrics": {
                                            "type": "array",
                                            "minItems": 1,
                                            "maxItems": 500,
                                            "items": {
                                                "type": "array",
                                                "minItems": 2,
                                                "prefixItems": [{"type": "string"}, {"type": "string"}],
                                                "items": {"anyOf": [{"type": "string"}, METRIC_OPTIONS]},
                                            },
                                        },
                                        "region": {"type": "string", "pattern": r"^[a-z]{2}(-[a-z]+)+-\d$"},
                                        "view": {"enum": ["timeSeries", "singleValue", "bar", "pie", "gauge"]},
                                        "stacked": {"type": "boolean"},
                                        "stat": {"type": "string", "pattern": STAT},
                                        "period": {"type": "integer", "minimum": 60, "multipleOf": 60},
                                        "title": {"type": "string", "maxLength": 255},
                                        "yAxis": {"type": "object"},
                                    },
                                    "additionalProperties": False,
                                }
                            }
                        },
                    },
                    {
                        "if": {"properties": {"type": {"const": "text"}}},
                        "then": {
                            "properties": {
                                "properties": {
                                    "type": "object",
                                    "required": ["markdown"],
                                    "properties": {"markdown": {"type": "string", "minLength": 1}},
                                    "additionalProperties": False,
                                }
                            }
                        },
                    },
                ],
            },
        }
    },
    "additionalProperties": False,
}
VALIDATOR = jsonschema_rs.validator_for(SCHEMA)
MODELS = {REAL_TIME: ("bert_base", "resnet", "yolov5"), MULTI_MODEL: ("resnet.tar.gz", "yolov5.tar.gz")}
COMPONENT_NAMES = ("ep-resnet", "ep-bert-base")


def body_for(form: str) -> dict:
    components = COMPONENT_NAMES if form == COMPONENTS else ()
    models = ("resnet", "bert_base") if form == COMPONENTS else MODELS[form]
    body = dashboard_body("ep", form, MetricsConfig(models=models), REGION, components)
    return json.loads(json.dumps(body))  # what PutDashboard receives, read back


def metric_rows(body: dict):
    for widget in body["widgets"]:
        if widget["type"] == "metric":
            for row in widget["properties"]["metrics"]:
                names = [item for item in row if isinstance(item, str)]
                yield names[0], names[1], dict(zip(names[2::2], names[3::2], strict=True))


@pytest.mark.parametrize("form", FORMS)
def test_the_body_is_valid_for_cloudwatch(form):
    body = body_for(form)
    errors = [f"{e.instance_path}: {e.message}" for e in VALIDATOR.iter_errors(body)]
    assert not errors, errors
    assert len(json.dumps(body)) < 100_000  # far below PutDashboard's limit on a body
    for widget in body["widgets"]:
        assert widget["x"] + widget["width"] <= 24, widget


@pytest.mark.parametrize("form", FORMS)
def test_no_two_widgets_overlap(form):
    boxes = [(w["x"], w["y"], w["x"] + w["width"], w["y"] + w["height"]) for w in body_for(form)["widgets"]]
    for a, b in combinations(boxes, 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)


@pytest.mark.parametrize("form", FORMS)
def test_every_metric_is_one_a_filter_or_sagemaker_publishes(form):
    body = body_for(form)
    components = COMPONENT_NAMES if form == COMPONENTS else ()
    published = {
        (t["metricNamespace"], t["metricName"]): tuple(t["dimensions"])
        for f in metric_filters("ep", form, components)
        for t in f["metricTransformations"]
    }
    models = ("resnet", "bert_base") if form == COMPONENTS else MODELS[form]
    seen = set()
    for namespace, name, dims in metric_rows(body):
        seen.add((namespace, name))
        if namespace == NAMESPACE:
            assert (namespace, name) in published, name
            assert tuple(dims) == published[(namespace, name)] == ("EndpointName", "Model")
            assert dims["EndpointName"] == "ep" and dims["Model"] in models
        else:
            assert (namespace, name) in SAGEMAKER_METRICS, (namespace, name)
            assert tuple(dims) in SAGEMAKER_METRICS[(namespace, name)], (namespace, name, dims)
            assert dims.get("EndpointName", "ep") == "ep" and dims.get("VariantName", "AllTraffic") == "AllTraffic"
            assert dims.get("InferenceComponentName", COMPONENT_NAMES[0]) in COMPONENT_NAMES
    # Every filter's metric is graphed for every model, and SageMaker's own sit beside them.
    assert set(published) <= seen
    assert any(ns != NAMESPACE for ns, _ in seen)


def test_each_model_has_its_p50_and_p99_latency():
    body = body_for(REAL_TIME)
    stats = {
        (row[1], row[5], row[-1]["stat"])
        for w in body["widgets"]
        if w["type"] == "metric"
        for row in w["properties"]["metrics"]
        if row[0] == NAMESPACE and isinstance(row[-1], dict) and "stat" in row[-1]
    }
    for model in MODELS[REAL_TIME]:
        for stat in ("p50", "p99"):
            assert ("Latency", model, stat) in stats and ("TritonLatency", model, stat) in stats


def test_the_stat_pattern_refuses_what_cloudwatch_refuses():
    assert re.match(STAT, "p99.9") and not re.match(STAT, "p999") and not re.match(STAT, "Median")
