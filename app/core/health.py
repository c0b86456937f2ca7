"""The answer to SageMaker's ``GET /ping``: healthy only when Triton and every served model are ready.

Used by the Flask router and by ``serve``'s own ping server, which answers ``/ping`` for NGINX so
that a health check never queues behind long inferences in the router's threads.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Protocol, Sequence

from app.core.errors import ApiError
from app.core.states import READY, UNKNOWN
from app.core.states import UNAVAILABLE as MISSING

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "healthy", "unhealthy"


class Readiness(Protocol):
    def model_states(self) -> dict[str, str]: ...

    def server_ready(self) -> bool: ...


def unhealthy(served: Iterable[str]) -> dict[str, Any]:
    """The body of a 503 when the models' states cannot be known (Triton or the router unreachable)."""
    return {"status": UNHEALTHY, "models": {name: UNKNOWN for name in sorted(served)}}


def model_state(states: Mapping[str, str], needs: Sequence[str]) -> str:
    """A served model's state from the Triton models it needs (``app.core.pipeline.triton_models``):
    READY when all are, else the first that is not."""
    for name in needs:
        if states.get(name, MISSING) != READY:
            return states.get(name, MISSING)
    return READY


def ping_answer(triton: Readiness, served: Mapping[str, Sequence[str]]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body). ``served``: each served model's name and the Triton models it needs.
    At most two short calls, each under the client's ping deadline: the repository index, then
    (only when every model is READY) the server's own readiness."""
    try:
        states = triton.model_states()
        models = {name: model_state(states, needs) for name, needs in sorted(served.items())}
        healthy = all(state == READY for state in models.values()) and triton.server_ready()
    except ApiError as error:
        log.warning("ping: %s", error.message)
        return 503, unhealthy(served)
    return (200 if healthy else 503), {"status": HEALTHY if healthy else UNHEALTHY, "models": models}
