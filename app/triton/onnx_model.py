"""Triton python-backend model: runs the version folder's ``model.onnx`` with ONNX Runtime.

Copied as ``<model>/1/model.py`` by scripts/model_prep/steps.py. Generic: tensor names and dtypes
come from the model's config.pbtxt. All requests of one ``execute()`` call are concatenated along
the batch axis (each padded to the longest, for a text model's ragged batches) and served by ONE
``session.run``; the outputs are split back per request.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # outside Triton (unit tests import run_batched from this file)
    pb_utils = None

ONNX_FILE = "model.onnx"
ORT_THREADS_PARAMETER = "ort_intra_op_threads"
# The kernel's OOM killer ends the process with the highest score first; 1000 is the highest.
OOM_SCORE_ADJ = 1000


def run_batched(
    run: Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]],
    feeds: Sequence[Mapping[str, np.ndarray]],
    output_names: Sequence[str],
) -> list[dict[str, np.ndarray]]:
    """Serve several requests with one ``run``: concatenate on axis 0, run, split back in order.

    ``feeds``: one {input name: array [b_i, ...]} per request. ``run`` takes the concatenated
    feed and returns the outputs in ``output_names`` order, each [sum(b_i), ...].
    """
    sizes = [len(next(iter(feed.values()))) for feed in feeds]
    batch = {name: joined([feed[name] for feed in feeds]) for name in feeds[0]}
    outputs = run(batch)
    total = sum(sizes)
    for name, array in zip(output_names, outputs):
        if len(array) != total:
            raise ValueError(f"output {name!r} has batch {len(array)}, expected {total}")
    bounds = np.cumsum(sizes)[:-1]
    pieces = [np.split(array, bounds, axis=0) for array in outputs]
    return [{name: piece[i] for name, piece in zip(output_names, pieces)} for i in range(len(feeds))]


def joined(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The requests' arrays of one input, concatenated on the batch axis; where their other axes differ
    (a text model's config allows ragged batches: requests of different lengths batched together), each
    zero-padded at the end of those axes to the largest. The padding is masked (``attention_mask`` 0),
    so its value does not reach the answers. One allocation: np.pad per request cost ten times more."""
    shape = tuple(max(sizes) for sizes in zip(*(a.shape[1:] for a in arrays)))
    if all(a.shape[1:] == shape for a in arrays):
        return np.concatenate(arrays, axis=0)
    batch = np.zeros((sum(len(a) for a in arrays), *shape), arrays[0].dtype)
    row = 0
    for a in arrays:
        batch[(slice(row, row + len(a)), *(slice(0, n) for n in a.shape[1:]))] = a
        row += len(a)
    return batch


def intra_op_threads(config: Mapping) -> int:
    """The ``ort_intra_op_threads`` parameter of a model config (JSON form); 0 when absent."""
    value = config.get("parameters", {}).get(ORT_THREADS_PARAMETER, {}).get("string_value", "")
    return int(value) if value.strip() else 0


def volunteer_for_the_oom_killer(path: Path = Path("/proc/self/oom_score_adj")) -> None:
    """Make this stub the OOM killer's first choice, before ONNX Runtime takes the model's memory.

    When a model does not fit (a multi-model load past what the instance has), the kernel then ends
    the stub that holds it, and Triton refuses that load (the router answers 507), instead of ending
    Triton, the largest process, which takes every model and the endpoint down with it. Raising
    one's own score needs no privilege."""
    try:
        path.write_text(str(OOM_SCORE_ADJ))
    except OSError:
        pass  # not Linux, or /proc read-only: the kernel's own choice stands


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import onnxruntime as ort

        volunteer_for_the_oom_killer()
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.outputs = [
            (tensor["name"], pb_utils.triton_string_to_numpy(tensor["data_type"])) for tensor in config["output"]
        ]
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads(config)
        options.inter_op_num_threads = 1
        path = Path(args["model_repository"]) / args["model_version"] / ONNX_FILE
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run([name for name, _ in self.outputs], feed)

    def _feed(self, request) -> dict[str, np.ndarray]:
        return {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.input_names}

    def execute(self, requests: list) -> list:
        feeds = [self._feed(request) for request in requests]
        names = [name for name, _ in self.outputs]
        try:
            return [self._response(result) for result in run_batched(self._run, feeds, names)]
        except Exception as error:  # noqa: BLE001 - any failure is answered; the model lives on
            if len(feeds) == 1:
                return [self._failure(error)]
        # One request's values (a token id past the vocabulary) must not fail the others batched with
        # it: each is run alone, and only those that fail alone get an error.
        answers = []
        for feed in feeds:
            try:
                answers.append(self._response(run_batched(self._run, [feed], names)[0]))
            except Exception as error:  # noqa: BLE001 - answered to that request alone
                answers.append(self._failure(error))
        return answers

    @staticmethod
    def _failure(error: Exception):
        """ONNX Runtime's refusal of the input's values (InvalidArgument) is the caller's fault: Triton
        answers it 400; anything else is the model's failure (500)."""
        message = f"inference failed: {error.__class__.__name__}: {error}"
        if error.__class__.__name__ == "InvalidArgument":
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))

    def _response(self, result: Mapping[str, np.ndarray]):
        tensors = [
            pb_utils.Tensor(name, np.ascontiguousarray(result[name], dtype=dtype)) for name, dtype in self.outputs
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        self.session = None


def limit_torch_threads(threads: int) -> None:
    """``generate``'s own tensor work (logits processors, beam scores over the whole vocabulary) on the
    threads the sizing gave this instance, as ONNX Runtime's. PyTorch would otherwise take every core
    in each instance's stub: on 2 vCPUs two instances of t5-small (2 x 1) generated 125 tokens/s at
    concurrency 8 (beam search 24) that way, 330 (162) on one thread each. 0: PyTorch's default.
    Where this process has not imported torch (a text_generation model that has only chosen greedy
    tokens), the limit waits for ``imported_torch``."""
    if threads > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    elif threads > 0:
        _TORCH_THREADS[:] = [threads]


_TORCH_THREADS: list[int] = []  # the limit given before torch was imported, until it is


def imported_torch():
    """torch, imported at the first call, on the threads ``limit_torch_threads`` gave this process
    (set once: the token loop calls this at every step)."""
    import torch  # here: most models' processes never import it

    if _TORCH_THREADS:
        torch.set_num_threads(_TORCH_THREADS.pop())
    return torch
