"""The per-model metrics' flags (deploy's, and this command's), and ``python -m scripts.sagemaker
metrics``: what deploy would create for an endpoint, printed without AWS (the metric filters, the
dashboard's JSON, the alarms, the Logs Insights queries), and with ``--lines FILE`` what each filter
makes of access lines (a ``serve`` log, or lines exported from CloudWatch).

    python -m scripts.sagemaker metrics --name multi-model
    python -m scripts.sagemaker metrics --name mm-mme --form multi-model
    python -m scripts.sagemaker metrics --name mm-ic --form inference-components --component resnet --component yolov5
    ./serve 2>&1 | tee serve.log ... ; python -m scripts.sagemaker metrics --name local --lines serve.log
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from app.core.settings import PROJECT_ROOT
from scripts.sagemaker import filter_pattern
from scripts.sagemaker.components import component_name
from scripts.sagemaker.dashboard import dashboard_body, dashboard_name
from scripts.sagemaker.model_metrics import (
    COMPONENTS,
    DEFAULT_5XX_PERCENT,
    DEFAULT_P99_MS,
    DEFAULT_RETENTION_DAYS,
    FORMS,
    MULTI_MODEL,
    NAMESPACE,
    REAL_TIME,
    RETENTION_DAYS,
    AlarmConfig,
    MetricsConfig,
    alarms,
    insights_queries,
    log_groups,
    metric_filters,
)
from scripts.sagemaker.resources import ARCHIVE_SUFFIX
from scripts.terminal import positive

PROG = "python -m scripts.sagemaker metrics"


def shipped_models() -> tuple[str, ...]:
    """The models this project serves (``models/<name>/model.toml``)."""
    return tuple(sorted(p.parent.name for p in (PROJECT_ROOT / "models").glob("*/model.toml")))


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected NAME[,NAME...]")
    return names


def _p99(text: str) -> tuple[str | None, float]:
    """``MS`` (every model) or ``NAME=MS``."""
    name, sep, value = text.rpartition("=")
    try:
        ms = positive(float)(value)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MS or NAME=MS ({error})") from None
    if sep and not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MS or NAME=MS, a NAME before the =")
    return (name or None), ms


def _percent(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"{value:g} is outside (0, 100]")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that shape the per-model metrics (the same on deploy and on this command)."""
    group = parser.add_argument_group("per-model metrics (CloudWatch, from the router's access lines)")
    group.add_argument(
        "--no-model-metrics", action="store_true", help="create no log group, metric filter, dashboard or alarm"
    )
    group.add_argument("--metrics-namespace", default=NAMESPACE, help=f"CloudWatch namespace (default: {NAMESPACE})")
    group.add_argument(
        "--metrics-models",
        type=_names,
        metavar="NAME[,NAME...]",
        help="the models the dashboard and the alarms show (default: the project's models, "
        f"{', '.join(shipped_models())}; <NAME>{ARCHIVE_SUFFIX} on a multi-model endpoint; the "
        "components' models with --inference-components). Metrics exist for every model called either way",
    )
    group.add_argument(
        "--log-retention-days",
        type=int,
        choices=RETENTION_DAYS,
        metavar="DAYS",
        help=f"the log group's retention (default: {DEFAULT_RETENTION_DAYS} for a log group deploy creates; "
        "one that exists keeps its own)",
    )
    group.add_argument("--no-alarms", action="store_true", help="metrics and dashboard, no alarms")
    group.add_argument(
        "--alarm-5xx-percent",
        type=_percent,
        default=DEFAULT_5XX_PERCENT,
        metavar="PERCENT",
        help=f"alarm when more than this share of a model's requests answer 5xx (default: {DEFAULT_5XX_PERCENT:g})",
    )
    group.add_argument(
        "--alarm-p99-ms",
        type=_p99,
        action="append",
        default=[],
        metavar="[NAME=]MS",
        help=f"alarm when a model's p99 latency passes this (default: {DEFAULT_P99_MS:g}; NAME=MS for one model; repeatable)",
    )
    group.add_argument(
        "--alarm-topic", metavar="SNS_TOPIC_ARN", help="notify this SNS topic when an alarm fires and clears"
    )


def metrics_config(args: argparse.Namespace, form: str, components: Sequence[str] = ()) -> MetricsConfig | None:
    """The MetricsConfig the flags say, for an endpoint of ``form`` (``components``: its models);
    None with --no-model-metrics."""
    if args.no_model_metrics:
        return None
    if components:
        models = tuple(components)
    else:
        models = args.metrics_models or shipped_models()
        if form == MULTI_MODEL:  # the Model dimension is the TargetModel the caller names
            models = tuple(m if m.endswith(ARCHIVE_SUFFIX) else m + ARCHIVE_SUFFIX for m in models)
    p99 = dict(args.alarm_p99_ms)
    settings = AlarmConfig(
        five_xx_percent=args.alarm_5xx_percent,
        p99_ms=p99.pop(None, DEFAULT_P99_MS),
        p99_ms_by_model=p99,
        topic_arn=args.alarm_topic,
    )
    return MetricsConfig(
        namespace=args.metrics_namespace,
        retention_days=args.log_retention_days,
        models=models,
        alarms=None if args.no_alarms else settings,
    )


def plan(name: str, form: str, config: MetricsConfig | None, region: str, components: Sequence[str] = ()) -> dict:
    """Everything deploy would create, as one JSON-ready document (nothing with ``config`` None)."""
    if config is None:
        return {"log_groups": [], "metric_filters": [], "dashboard": None, "alarms": [], "insights_queries": {}}
    return {
        "log_groups": log_groups(name, form, components),
        "metric_filters": metric_filters(name, form, components, config.namespace),
        "dashboard": {"name": dashboard_name(name), "body": dashboard_body(name, form, config, region, components)},
        "alarms": alarms(name, config),
        "insights_queries": insights_queries(form),
    }


def show_lines(filters: list[dict], lines: list[str], out: TextIO | None = None) -> None:
    """For each filter, the lines it selects and what it publishes for each."""
    out = out or sys.stdout
    for metric_filter in filters:
        print(f"{metric_filter['filterName']}: {metric_filter['filterPattern']}", file=out)
        selected = 0
        for number, line in enumerate(lines, 1):
            for published in filter_pattern.publish(metric_filter, line):
                selected += 1
                dims = ", ".join(f"{k}={v}" for k, v in published.dimensions.items())
                print(
                    f"  line {number}: {published.metric} {published.value:g} {published.unit or ''} ({dims})", file=out
                )
        print(f"  {selected} of {len(lines)} lines", file=out)


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--name", default="multi-model", help="the endpoint's name (default: multi-model)")
    made.add_argument("--form", choices=FORMS, default=REAL_TIME, help=f"the kind of endpoint (default: {REAL_TIME})")
    made.add_argument(
        "--component",
        action="append",
        default=[],
        metavar="NAME",
        help=f"with --form {COMPONENTS}: a component's model",
    )
    made.add_argument(
        "--region", default="us-east-1", help="the region the dashboard's graphs read (default: us-east-1)"
    )
    made.add_argument("--lines", type=Path, metavar="FILE", help="show what each filter makes of these log lines")
    add_arguments(made)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    made = parser()
    args = made.parse_args(argv)
    if (args.form == COMPONENTS) != bool(args.component):
        made.error(f"--component goes with --form {COMPONENTS}, and that form needs at least one")
    components = [component_name(args.name, model) for model in args.component]
    config = metrics_config(args, args.form, args.component)
    if args.lines and config is None:
        made.error("--lines applies the filters: --no-model-metrics makes none")
    document = plan(args.name, args.form, config, args.region, components)
    if args.lines:
        first = document["log_groups"][0]  # every log group has the same filters
        filters = [f for f in document["metric_filters"] if f["logGroupName"] == first]
        show_lines(filters, args.lines.read_text(errors="replace").splitlines())
        return 0
    print(json.dumps(document, indent=2, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
