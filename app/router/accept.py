"""The media type of an ``/invocations`` answer, from the request's ``Accept`` header: Werkzeug's
``MIMEAccept`` ranks our answer types (kept apart from ``app.router.parsing``, whose pure parsing
the benchmark's tools import without the web framework)."""

from __future__ import annotations

from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from app.core.errors import NotAcceptable
from app.router.parsing import ANSWER_TYPES, JSON_TYPE, JSONLINES_TYPES, Request


def answer_type(request: Request) -> str:
    """The media type to answer in: the one of ``ANSWER_TYPES`` that ``Accept`` ranks best (its q
    values, the most specific range that matches each type, wildcards), by Werkzeug's
    ``MIMEAccept``. The body's own form (JSON Lines for JSON Lines, else JSON) is offered first, so
    no Accept, ``*/*`` and ``application/*`` answer in it; none acceptable is a 406. A range's
    parameters other than q (``charset=utf-8``) are not matched: every answer is UTF-8."""
    default = request.mimetype if request.mimetype in JSONLINES_TYPES else JSON_TYPE
    if not request.accept.strip():
        return default
    ranges = MIMEAccept([(kind.partition(";")[0].strip(), q) for kind, q in parse_accept_header(request.accept)])
    chosen = ranges.best_match([default, *(kind for kind in ANSWER_TYPES if kind != default)])
    if chosen is None:
        raise NotAcceptable(f"Accept: {request.accept} cannot be answered; answers are {', '.join(ANSWER_TYPES)}")
    return chosen
