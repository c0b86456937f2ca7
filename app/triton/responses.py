"""Responses of the project's python-backend Triton models: an error response (``error_response``), and
for the models that answer each request on its own (SAM, the zero-shot detectors, the chain of the
two: one image a request), ``answer_each``: a request's outputs or its error, ``INVALID_ARG`` for
what the caller sent (the router answers a 400), the model's failure otherwise; the other requests
of the call are answered all the same."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from app.core.errors import InvalidItem

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # outside Triton (unit tests call the models' classes)
    pb_utils = None


def present(tensor) -> np.ndarray | None:
    """A request's input as an array; None where the request left an optional input out."""
    return None if tensor is None else tensor.as_numpy()


class Refused(ValueError):
    """Values of a request the model cannot run on (the caller's fault: a 400)."""


def error_response(message: str, code=None):
    """An error response; ``code`` one of Triton's (``pb_utils.TritonError.INVALID_ARG``...)."""
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)


def answer_each(
    requests: Sequence[Any],
    names: Sequence[str],
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    what: str,
) -> list:
    """Each request's inputs ``names`` given to ``run`` (None for an optional one it left out), its
    outputs (by name) answered; ``what`` names the model's work in the message of a failure that is
    not the caller's."""
    answers = []
    for request in requests:
        given = {name: present(pb_utils.get_input_tensor_by_name(request, name)) for name in names}
        try:
            outputs = run(given)
        except InvalidItem as error:
            answers.append(error_response(InvalidItem.encode(0, error.message), pb_utils.TritonError.INVALID_ARG))
            continue
        except Refused as error:
            answers.append(error_response(str(error), pb_utils.TritonError.INVALID_ARG))
            continue
        except Exception as error:  # noqa: BLE001 - every request is answered; the model lives on
            answers.append(error_response(f"{what} failed: {error.__class__.__name__}: {error}"))
            continue
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in outputs.items()]
        answers.append(pb_utils.InferenceResponse(output_tensors=tensors))
    return answers
