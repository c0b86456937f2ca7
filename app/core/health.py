"""The answer to SageMaker's ``GET /ping``: healthy when Triton and every required model are ready.

A model is required unless its ``model.toml`` says ``required = false``: an optional model that is
not ready is listed with its state, and its requests answer 503 ``model_not_ready``, but the
instance stays healthy (SageMaker does not replace it). With ``SAGEMAKER_TRITON_PING_MODE=live``
(the stock SageMaker Triton image's variable) ``/ping`` is healthy while Triton is live at all.

Used by the Flask router and by ``serve``'s own ping server, which answers ``/ping`` for NGINX so
that a health check never queues behind long inferences in the router's threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.core.errors import ApiError
from app.core.model_store import ModelStore
from app.core.pipeline import triton_models
from app.core.settings import LIVE_PING, READY_PING, Settings
from app.core.spec import ModelSpec
from app.core.states import READY, UNKNOWN
from app.core.states import UNAVAILABLE as MISSING

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "healthy", "unhealthy"


class Readiness(Protocol):
    def model_states(self) -> dict[str, str]: ...

    def server_ready(self) -> bool: ...

    def server_live(self) -> bool: ...


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


@dataclass(frozen=True)
class HealthPolicy:
    """What ``/ping`` checks: each served model with the Triton models it needs, which of them may
    be down without the instance being unhealthy, and the ping mode (``ready`` or ``live``)."""

    served: Mapping[str, Sequence[str]]
    optional: frozenset[str] = field(default_factory=frozenset)
    mode: str = READY_PING

    @classmethod
    def of(cls, specs: Mapping[str, ModelSpec], mode: str = READY_PING) -> HealthPolicy:
        return cls(
            served={name: triton_models(name, spec.pipeline) for name, spec in sorted(specs.items())},
            optional=frozenset(name for name, spec in specs.items() if not spec.required),
            mode=mode,
        )


def health_policy(settings: Settings, specs: Mapping[str, ModelSpec]) -> Callable[[], HealthPolicy]:
    """What each ``/ping`` checks: the served models' policy, fixed at start; in multi-model mode,
    the models loaded at the moment, each with every Triton model it loaded, none of them required
    (a model that fails is SageMaker's to unload, not a reason to replace the instance)."""
    if not settings.multi_model:
        policy = HealthPolicy.of(specs, settings.ping)
        return lambda: policy
    store = ModelStore(settings.multi_model_dir)

    def loaded() -> HealthPolicy:
        served = {record.model_name: tuple(record.folders) for record in store.loaded()}
        return HealthPolicy(served=served, optional=frozenset(served), mode=settings.ping)

    return loaded


def ping_answer(triton: Readiness, policy: HealthPolicy) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body listing every served model's state). At most two short calls, each under
    the client's ping deadline: the repository index, then Triton's own readiness (``ready`` mode,
    only when every required model is READY) or liveness (``live`` mode)."""
    try:
        states = triton.model_states()
        models = {name: model_state(states, needs) for name, needs in sorted(policy.served.items())}
        if policy.mode == LIVE_PING:
            healthy = triton.server_live()
        else:
            required = (state for name, state in models.items() if name not in policy.optional)
            healthy = all(state == READY for state in required) and triton.server_ready()
    except ApiError as error:
        log.warning("ping: %s", error.message)
        return 503, unhealthy(policy.served)
    return (200 if healthy else 503), {"status": HEALTHY if healthy else UNHEALTHY, "models": models}
