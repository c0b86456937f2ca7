"""The endpoint's CloudWatch dashboard: per model, requests, errors and latency p50/p99 (the metric
filters' metrics, ``scripts/sagemaker/model_metrics.py``) beside SageMaker's own endpoint metrics and
the instances' CPU, memory and GPU utilisation.

``SAGEMAKER_METRICS`` is what SageMaker publishes that the dashboard shows, with the dimensions it
publishes them under (SageMaker's "metrics in Amazon CloudWatch" page: invocation metrics in
``AWS/SageMaker``, instance utilisation in ``/aws/sagemaker/Endpoints``, an inference component's in
``/aws/sagemaker/InferenceComponents``); a widget names no other metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scripts.sagemaker.model_metrics import (
    COMPONENTS,
    ENDPOINT_DIMENSION,
    MODEL_DIMENSION,
    MULTI_MODEL,
    PERIOD_S,
    MetricsConfig,
)
from scripts.sagemaker.scaling import VARIANT

INVOCATION_NAMESPACE = "AWS/SageMaker"
INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"
COMPONENT_NAMESPACE = "/aws/sagemaker/InferenceComponents"
VARIANT_DIMENSIONS = ("EndpointName", "VariantName")
COMPONENT_DIMENSIONS = ("InferenceComponentName",)
# (namespace, metric) -> the dimension sets SageMaker publishes it under.
SAGEMAKER_METRICS: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {
    **{
        (INVOCATION_NAMESPACE, name): (VARIANT_DIMENSIONS, COMPONENT_DIMENSIONS)
        for name in ("Invocations", "Invocation4XXErrors", "Invocation5XXErrors", "ModelLatency", "OverheadLatency")
    },
    **{
        (INSTANCE_NAMESPACE, name): (VARIANT_DIMENSIONS,)
        for name in ("CPUUtilization", "MemoryUtilization", "GPUUtilization", "GPUMemoryUtilization", "DiskUtilization")
    },
    # Multi-model endpoints: model loading (AWS/SageMaker) and the models loaded on an instance.
    **{(INVOCATION_NAMESPACE, name): (VARIANT_DIMENSIONS,) for name in ("ModelCacheHit", "ModelLoadingWaitTime")},
    (INSTANCE_NAMESPACE, "LoadedModelCount"): (VARIANT_DIMENSIONS,),
    **{
        (COMPONENT_NAMESPACE, name): (COMPONENT_DIMENSIONS,)
        for name in (
            "CPUUtilizationNormalized",
            "CPUMemoryUtilizationNormalized",
            "GPUUtilizationNormalized",
            "GPUMemoryUtilizationNormalized",
        )
    },
}
WIDTH, HEIGHT, COLUMNS = 8, 6, 3  # three graphs a row on CloudWatch's 24-column grid


def dashboard_name(endpoint: str) -> str:
    return f"{endpoint}-per-model"


def _metric(namespace: str, name: str, dimensions: dict[str, str], **options: Any) -> list[Any]:
    row: list[Any] = [namespace, name]
    for key, value in dimensions.items():
        row += [key, value]
    return row + ([options] if options else [])


def _graph(title: str, metrics: list[list[Any]], region: str, stat: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "metric",
        "properties": {
            "title": title,
            "view": "timeSeries",
            "stacked": False,
            "region": region,
            "period": PERIOD_S,
            "stat": stat,
            "metrics": metrics,
            **extra,
        },
    }


def _per_model(config: MetricsConfig, endpoint: str, name: str, **options: Any) -> list[list[Any]]:
    return [
        _metric(
            config.namespace,
            name,
            {ENDPOINT_DIMENSION: endpoint, MODEL_DIMENSION: model},
            label=f"{model}{' ' + options['stat'] if 'stat' in options else ''}",
            **options,
        )
        for model in config.models
    ]


def _model_graphs(config: MetricsConfig, endpoint: str, region: str) -> list[dict[str, Any]]:
    ms = {"yAxis": {"left": {"label": "ms", "showUnits": False}}}
    return [
        _graph("Requests per model", _per_model(config, endpoint, "Invocations"), region, "Sum"),
        _graph("5xx per model", _per_model(config, endpoint, "Invocation5XXErrors"), region, "Sum"),
        _graph("4xx per model", _per_model(config, endpoint, "Invocation4XXErrors"), region, "Sum"),
        _graph(
            "Latency per model, p50 and p99 (router, ms)",
            _per_model(config, endpoint, "Latency", stat="p50") + _per_model(config, endpoint, "Latency", stat="p99"),
            region,
            "p99",
            **ms,
        ),
        _graph(
            "Triton's part per model, p50 and p99 (ms)",
            _per_model(config, endpoint, "TritonLatency", stat="p50")
            + _per_model(config, endpoint, "TritonLatency", stat="p99"),
            region,
            "p99",
            **ms,
        ),
        _graph(
            "Tokens generated per model (text2text, text_generation; a minute's sum)",
            _per_model(config, endpoint, "GeneratedTokens"),
            region,
            "Sum",
        ),
        _graph(
            "Time to first token per model, p50 and p99 (text_generation, s)",
            _per_model(config, endpoint, "TimeToFirstToken", stat="p50")
            + _per_model(config, endpoint, "TimeToFirstToken", stat="p99"),
            region,
            "p99",
        ),
        _graph(
            "Tokens per second per request, p50 (text_generation)",
            _per_model(config, endpoint, "GenerationTokensPerSecond", stat="p50"),
            region,
            "p50",
        ),
        _graph(
            "Tool calls and constrained requests per model (text_generation; a minute's sum)",
            _per_model(config, endpoint, "ToolCalls") + _per_model(config, endpoint, "ConstrainedRequests"),
            region,
            "Sum",
        ),
        _graph(
            "Detections per model (zero_shot_object_detection, grounded_segmentation; a minute's sum)",
            _per_model(config, endpoint, "Detections"),
            region,
            "Sum",
        ),
        _graph(
            "Masks per model (mask_generation, grounded_segmentation; a minute's sum)",
            _per_model(config, endpoint, "Masks"),
            region,
            "Sum",
        ),
    ]


def _variant_graphs(endpoint: str, region: str, multi_model: bool) -> list[dict[str, Any]]:
    variant = {"EndpointName": endpoint, "VariantName": VARIANT}
    graphs = [
        _graph(
            "Endpoint (SageMaker): requests and errors",
            [
                _metric(INVOCATION_NAMESPACE, name, variant)
                for name in ("Invocations", "Invocation4XXErrors", "Invocation5XXErrors")
            ],
            region,
            "Sum",
        ),
        _graph(
            "Endpoint (SageMaker): model and overhead latency p99 (µs)",
            [_metric(INVOCATION_NAMESPACE, name, variant) for name in ("ModelLatency", "OverheadLatency")],
            region,
            "p99",
        ),
        _graph(
            "Instances: CPU, memory, GPU (%)",
            [
                _metric(INSTANCE_NAMESPACE, name, variant)
                for name in ("CPUUtilization", "MemoryUtilization", "GPUUtilization", "GPUMemoryUtilization")
            ],
            region,
            "Average",
        ),
    ]
    if multi_model:
        graphs.append(
            _graph(
                "Multi-model: cache hits, load waits (ms), models loaded",
                [
                    _metric(INVOCATION_NAMESPACE, "ModelCacheHit", variant),
                    _metric(INVOCATION_NAMESPACE, "ModelLoadingWaitTime", variant, stat="p99"),
                    _metric(INSTANCE_NAMESPACE, "LoadedModelCount", variant),
                ],
                region,
                "Average",
            )
        )
    return graphs


def _component_graphs(components: Sequence[str], region: str) -> list[dict[str, Any]]:
    def each(namespace: str, name: str) -> list[list[Any]]:
        return [_metric(namespace, name, {"InferenceComponentName": c}, label=f"{c} {name}") for c in components]

    return [
        _graph(
            "Inference components (SageMaker): requests and 5xx",
            each(INVOCATION_NAMESPACE, "Invocations") + each(INVOCATION_NAMESPACE, "Invocation5XXErrors"),
            region,
            "Sum",
        ),
        _graph(
            "Inference components (SageMaker): model latency p99 (µs)",
            each(INVOCATION_NAMESPACE, "ModelLatency"),
            region,
            "p99",
        ),
        _graph(
            "Inference components: CPU and GPU (% of what their copies reserve)",
            each(COMPONENT_NAMESPACE, "CPUUtilizationNormalized")
            + each(COMPONENT_NAMESPACE, "GPUUtilizationNormalized"),
            region,
            "Average",
        ),
    ]


def dashboard_body(
    endpoint: str, form: str, config: MetricsConfig, region: str, components: Sequence[str] = ()
) -> dict[str, Any]:
    """The ``DashboardBody`` (as a dict; PutDashboard takes its JSON text): a title, then graphs in
    rows of three, each placed on the grid."""
    graphs = _model_graphs(config, endpoint, region)
    graphs += (
        _component_graphs(components, region)
        if form == COMPONENTS
        else _variant_graphs(endpoint, region, form == MULTI_MODEL)
    )
    title = {
        "type": "text",
        "x": 0,
        "y": 0,
        "width": 24,
        "height": 2,
        "properties": {
            "markdown": (
                f"# {endpoint}: each model on its own\n"
                f"Per model (namespace `{config.namespace}`, from the router's access lines), then SageMaker's "
                "own metrics for the endpoint and its instances. Alarms: `"
                + endpoint
                + "/<model>/5xx-rate`, `"
                + endpoint
                + "/<model>/p99-latency`."
            )
        },
    }
    widgets = [title]
    for index, graph in enumerate(graphs):
        row, column = divmod(index, COLUMNS)
        widgets.append({**graph, "x": column * WIDTH, "y": 2 + row * HEIGHT, "width": WIDTH, "height": HEIGHT})
    return {"widgets": widgets}
