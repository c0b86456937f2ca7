"""What a model family is, in one object: everything that varies by family, held by its own module.

Each family's module in ``clients/`` (``clients/classification.py``, ``clients/fill_mask.py``, ...)
ends with one ``Family``; ``clients.families.FAMILIES`` lists them, and nothing else in the tree
asks a family's name what to do: it asks the family. As Hugging Face's ``SUPPORTED_TASKS`` holds a
task's pipeline class, its model class and its modality, a ``Family`` holds:

- ``client``: the ``ModelClient`` subclass serving it (options, pre- and post-processing);
- ``complete``: how a two-line ``model.toml`` is completed from a Hugging Face folder (``[export]
  transformers``: its tensors, batch size and what the family reads there); None: model.toml
  describes the tensors itself;
- ``export``: how a folder of the family becomes its network, named lazily (``"module:attribute"``,
  an object with ``prepare(spec, options, steps)``: ``scripts.model_prep``) so that the router never
  imports torch; a model.toml that describes its tensors brings its network itself (``[export]
  builder`` or ``onnx``), whatever its family;
- ``pipelines``: where its pre- and post-processing may run (``app.core.pipeline``), the default first;
  ``dali``: its Triton pipeline's preprocessing also runs as NVIDIA DALI on a GPU;
  ``graph_postprocess``: on the Triton pipeline its post-processing joins the network's graph
  (a detector's NMS), so its preprocessing step also answers the letterbox's geometry;
- ``parts``: the model.toml keys that name other models of the repository (a chain's detector and
  segmenter) rather than a folder to export: such a family ``chains``, and ``complete`` reads its
  model.toml whatever its ``[export]``; a multi-model archive of it carries those models' folders;
- ``loop``: the network is a python-backend model on every target (``generate``'s loop; SAM's two
  graphs behind one model), which the sizing plan counts as a network on the CPU;
- ``small``: how a small model of the family is built (seeded random or briefly trained weights, for
  the tests, the benchmarks' smoke runs and the docs' examples), named as ``export`` is:
  ``"module:attribute"``, a callable ``(models folder, name, **options) -> the model's folder``
  (``scripts.model_prep.small_models``); none for a family without small models;
- ``streams``: its Triton model is decoupled (``model_transaction_policy { decoupled: true }``): it
  answers a request with a response per generated token, over gRPC's stream, and batches the requests
  itself (they join its running batch at the next step): ``max_batch_size`` 0, no dynamic batching;
- ``result``: the JSON schema of one input's result, its client's ``RESULT_SCHEMA``, with its
  options (``OPTIONS``) and input (``input_field``, ``INPUT_SCHEMA``) the OpenAPI document's
  (``app.router.openapi``);
- ``counters``: metrics of its own, a count its client reports per request (``timings[key]``),
  exported as a counter by model; ``measures``: a value its client reports per request, observed
  by a histogram by model (a generation's time to its first token).

Framework-free (standard library only): the shared layer reads it, the layers above fill it in.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.pipeline import ROUTER, TRITON


@dataclass(frozen=True)
class Counter:
    """A family's own metric: the count its client puts in a request's ``timings[key]``."""

    key: str  # the timings' key, and the access log line's field
    metric: str  # the router's Prometheus counter, labelled by model
    help: str


@dataclass(frozen=True)
class Measure:
    """A family's own distribution: the value its client puts in a request's ``timings[key]``."""

    key: str  # the timings' key, and the access line's field
    metric: str  # the router's Prometheus histogram, labelled by model
    help: str
    buckets: tuple[float, ...]


def imported(name: str) -> Any:
    """``"module:attribute"``'s object, its module imported now."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Family:
    name: str
    client: Any  # the clients.base.ModelClient subclass (the layer above fills it in)
    # (raw model.toml, model folder, where) -> (the model.toml completed, what the family read); None: no folder to read
    complete: Callable[[Mapping[str, Any], Path, str], tuple[dict[str, Any], Any]] | None = None
    export: str = ""  # "module:attribute": an object with prepare(spec, options, steps) (model preparation)
    pipelines: tuple[str, ...] = (ROUTER,)  # where pre- and post-processing may run; the default first
    dali: bool = False
    graph_postprocess: bool = False
    parts: tuple[str, ...] = ()
    small: str = ""  # "module:attribute": (models, name, **options) -> a small model's folder
    loop: bool = False
    streams: bool = False
    # A loop family's inputs that a KServe v2 caller may leave out: its config.pbtxt marks them
    # ``optional`` and its Triton model stands in for one left out (SAM: empty; text2text: the folder's
    # default); the router always sends them all
    optional_inputs: tuple[str, ...] = ()
    counters: tuple[Counter, ...] = ()
    measures: tuple[Measure, ...] = ()

    @property
    def result(self) -> Mapping[str, Any]:
        """The JSON schema of one input's result: its client's ``RESULT_SCHEMA`` (the OpenAPI document's)."""
        return self.client.RESULT_SCHEMA

    @property
    def chains(self) -> bool:
        """Whether its model.toml names other models of the repository (``parts``)."""
        return bool(self.parts)

    @property
    def triton_pipeline(self) -> bool:
        """Whether Triton can run its pre- and post-processing (an ensemble)."""
        return TRITON in self.pipelines

    def exporter(self) -> Any:
        """The object that prepares the family's network, imported now (model preparation only)."""
        return imported(self.export)

    def small_builder(self) -> Any:
        """The builder of the family's small models, imported now; ValueError where it has none."""
        if not self.small:
            raise ValueError(f"family {self.name!r} builds no small models")
        return imported(self.small)
