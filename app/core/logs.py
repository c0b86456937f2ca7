"""One JSON object per log line on stdout, for the router's and gunicorn's loggers.

A record's ``fields`` (``extra={"fields": {...}}``) are merged into its object: the access log
(``app/router/observability.py``) puts its request id, model, status and durations there.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from app.core.access import LOGGER_FIELD


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            LOGGER_FIELD: record.name,  # "app.access" on the access lines that metric filters select
            "process": record.process,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def logging_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict (also gunicorn's ``logconfig_dict``)."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"stdout": handler},
        "root": {"level": level, "handlers": ["stdout"]},
        "loggers": {
            "gunicorn.error": {"level": level, "handlers": ["stdout"], "propagate": False},
            # gunicorn writes access lines whenever a logging config is given; each request is
            # already one JSON line from app.access (app/router/observability.py), so these are dropped.
            "gunicorn.access": {"level": level, "handlers": [], "propagate": False},
        },
    }
