"""Running parsed invocations: one, or every line of a JSON Lines body, model by model.

The lines of one model go to its client together (``ModelClient.run``), so their items share
Triton calls; the answer keeps the lines' order. A line whose item is refused fails the whole
request with a ``LineError`` naming it: nothing is answered for the other lines. What can be
refused without inference (``ModelClient.check``: an image's header) is, for every line, before
any line runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core.errors import ApiError, LineError
from app.router.parsing import Invocation
from clients.base import WorkFailed


def answer(invocation: Invocation, result: Any, version: str) -> dict[str, Any]:
    """What a call answers: the model, the version that served it, the result."""
    return {"modelname": invocation.client.name, "version": version, "result": result}


def run_invocations(
    invocations: Sequence[Invocation],
    *,
    numbered: bool,
    timings: dict[str, float] | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Each invocation's answer, in order. ``numbered``: the invocations are lines, and an error
    caused by one is a ``LineError`` with its number (from 1); else the error as it is."""

    def blame(index: int, error: ApiError) -> ApiError:
        return LineError(index + 1, error) if numbered else error

    works = []
    for index, call in enumerate(invocations):
        try:
            works.append(call.client.plan(call.payload, call.version, label=call.label))
            if len(invocations) > 1:  # every line's items before any line's inference
                call.client.check(works[-1])
        except ApiError as error:
            raise blame(index, error) from None
    by_model: dict[str, list[int]] = {}
    for index, call in enumerate(invocations):
        by_model.setdefault(call.client.name, []).append(index)
    answers: list[dict[str, Any] | None] = [None] * len(invocations)
    for indices in by_model.values():
        client = invocations[indices[0]].client
        try:
            done = client.run([works[i] for i in indices], timings, deadline)
        except WorkFailed as failed:
            raise blame(indices[failed.index], failed.error) from None
        for index, (result, version) in zip(indices, done):
            answers[index] = answer(invocations[index], result, version)
    return answers  # type: ignore[return-value]
