"""The abstract model client: ``inference(payload)`` = options -> preprocess -> Triton -> postprocess.

A family subclass declares its input field, the raw content types it takes and its options
(type, range, default from the model's ``[postprocess]``), reads its spec settings in ``configure``
(labels, tokenizer, layout ...), and implements ``preprocess`` (one item -> its input arrays and a
context) and ``postprocess`` (one item's outputs and its context -> the result). Whatever a request
needs between the two travels in that context, never on ``self``: one client serves many threads at
once.

Construction, in ``ModelClient.__init__`` and nowhere else: ``check_settings`` (every key is one
the family reads), the shared state (spec, name, triton, settings, output names), ``configure``,
then the options, bounded by ``option_limits`` (which may use what ``configure`` read).

A model's requests take one of two routes (``app.core.pipeline``): ``ROUTER``, the network called
with the tensors ``preprocess`` makes, and, for a family that has one, ``TRITON``: an ensemble that
runs the pre- and post-processing inside Triton, fed by ``pipeline_preprocess`` and read by
``pipeline_postprocess``. The spec's ``pipeline`` picks the route; a request that names a version
of the network takes the router's route, so every version stays callable.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from app.core.errors import ApiError, InferenceTimeout, InvalidInput, InvalidItem
from app.core.pipeline import ROUTER, TRITON, triton_models
from app.core.settings import SERVER_TIMEOUT, Settings
from app.core.spec import ModelSpec, SpecError, TensorSpec
from clients.batching import stack
from clients.options import Option

Context = TypeVar("Context")


class Triton(Protocol):
    """What a client needs from Triton (``clients.triton.TritonClient``, or a fake in tests)."""

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        version: str | None = None,
    ) -> tuple[dict[str, np.ndarray], str]: ...


def check_keys(spec: ModelSpec, table: str, settings: Mapping[str, Any], known: frozenset[str] | set[str]) -> None:
    """Refuse a ``[table]`` key the family does not read, naming the ones it does."""
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise SpecError(
            f"{spec.folder}/model.toml: [{table}] {unknown[0]} is not a setting of the {spec.family} family "
            f"(settings: {', '.join(sorted(known)) or 'none'})"
        )


@dataclass(frozen=True)
class Route:
    """Where one request goes: the Triton model, its input and output tensors, and the two ends."""

    model: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    prepare: Any  # (item, where, options) -> (arrays, context)
    finish: Any  # (outputs, context, options) -> result


@contextmanager
def timed(timings: dict[str, float] | None, stage: str) -> Iterator[None]:
    """Adds the seconds spent in the block to ``timings[stage]`` (the router's metrics and log)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        if timings is not None:
            timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - began


class ModelClient(ABC, Generic[Context]):
    """A model served by Triton, with its pre- and post-processing."""

    family: ClassVar[str]
    input_field: ClassVar[str]  # the payload field holding one item or a list of them
    content_types: ClassVar[frozenset[str]]  # raw-body media types, besides the JSON envelope
    OPTIONS: ClassVar[tuple[Option, ...]] = ()  # the options table: name, type, range, family default
    # The settings a model.toml may give the family; any other key is a typo, refused at start-up.
    PREPROCESS_KEYS: ClassVar[frozenset[str]] = frozenset()
    POSTPROCESS_KEYS: ClassVar[frozenset[str]] = frozenset()  # besides each option and max_<option>
    # Payload fields besides the input field and the options (a text pair's second texts).
    EXTRA_FIELDS: ClassVar[frozenset[str]] = frozenset()
    # The JSON schema of one item of an extra field that is not the input's (app.router.openapi).
    FIELD_SCHEMAS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    # Extra fields taken whole, not one item or a list of them (a JSON Schema the answer follows).
    WHOLE_FIELDS: ClassVar[frozenset[str]] = frozenset()
    # The JSON schema of one item of the input field (and the extra fields); of one input's result
    # (app.router.openapi builds the OpenAPI document from them; {}: any JSON value).
    INPUT_SCHEMA: ClassVar[Mapping[str, Any]] = {"type": "string"}
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, spec: ModelSpec, triton: Triton, settings: Settings) -> None:
        self.check_settings(spec)  # before any is read: a misspelt key is named as such
        self.spec = spec
        self.name = spec.name
        self.triton = triton
        self.settings = settings
        self.output_names = tuple(t.name for t in spec.outputs)
        self.pipeline = spec.pipeline
        self.triton_models = triton_models(
            spec.triton_name, spec.pipeline
        )  # what must be READY in Triton for this model
        self.configure()
        limits, choices = self.option_limits(), self.option_choices()
        self.options: dict[str, Option] = {o.name: self._bounded(o, limits, choices) for o in self.OPTIONS}
        self.routes = {ROUTER: Route(spec.triton_name, spec.inputs, spec.outputs, self.preprocess, self.postprocess)}
        if self.pipeline == TRITON:
            self.routes[TRITON] = self.pipeline_route()

    @classmethod
    def of(cls, spec: ModelSpec) -> type[ModelClient]:
        """The class that serves ``spec`` (a family whose models come more than one way picks here)."""
        return cls

    @classmethod
    def check_settings(cls, spec: ModelSpec) -> None:
        """Every ``[preprocess]`` / ``[postprocess]`` key is one the family reads (a typo stops the start)."""
        check_keys(spec, "preprocess", spec.preprocess, cls.PREPROCESS_KEYS)
        option_keys = {key for o in cls.OPTIONS for key in (o.name, *([f"max_{o.name}"] if o.numeric else []))}
        check_keys(spec, "postprocess", spec.postprocess, cls.POSTPROCESS_KEYS | option_keys)

    def configure(self) -> None:
        """Reads the family's spec settings onto ``self`` (a family calls ``super().configure()``).

        Runs once, after ``check_settings`` and the shared state, before the options are built; a
        bad setting raises ``SpecError``. Nothing per request belongs here.
        """

    def pipeline_route(self) -> Route:
        """The route through the model's Triton ensemble (families that have one override this)."""
        raise SpecError(f"{self.spec.folder}: the {self.family} family has no Triton pipeline")

    def route(self, version: str | None) -> Route:
        """The Triton pipeline when the model uses it, unless a version of the network is named."""
        return self.routes[TRITON if self.pipeline == TRITON and version is None else ROUTER]

    def option_limits(self) -> Mapping[str, float]:
        """Upper bounds that depend on the model (a top-k no larger than its classes)."""
        return {}

    def option_defaults(self) -> Mapping[str, Any]:
        """Defaults that depend on the model (the classification function its config implies)."""
        return {}

    def option_choices(self) -> Mapping[str, tuple[str, ...]]:
        """Choices that depend on the model (the prompt names its folder has)."""
        return {}

    def _bounded(self, option: Option, limits: Mapping[str, float], choices: Mapping[str, tuple[str, ...]]) -> Option:
        """The family's option with the model's default (``[postprocess] <name>``, else
        ``option_defaults``) and bound (``[postprocess] max_<name>``, and ``option_limits``), or
        choices (``option_choices``)."""
        post = self.spec.postprocess
        bounded = option
        if option.name in choices:
            bounded = replace(option, choices=choices[option.name])
        if option.numeric:
            maximum = min(option.maximum, post.get(f"max_{option.name}", option.maximum))
            bounded = replace(bounded, maximum=min(maximum, limits.get(option.name, maximum)))
        default = post.get(option.name, self.option_defaults().get(option.name, option.default))
        if default is None:
            return bounded
        where = f"{self.spec.folder}/model.toml: [postprocess] {option.name}"
        try:
            return replace(bounded, default=bounded.parse(default, where))
        except InvalidInput as error:
            raise SpecError(error.message) from None

    @abstractmethod
    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Context]:
        """One input item -> its arrays (keyed by input name, no batch axis) and its context."""

    @abstractmethod
    def postprocess(self, outputs: Mapping[str, np.ndarray], context: Context, options: Mapping[str, Any]) -> Any:
        """One item's outputs (keyed by output name, no batch axis) and context -> its result."""

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Every option of the family, from the payload or its default; unknown keys are refused."""
        unknown = sorted(
            k for k in payload if k != self.input_field and k not in self.options and k not in self.EXTRA_FIELDS
        )
        if unknown:
            raise InvalidInput(
                f"payload.{unknown[0]} is not an option of {self.name!r} "
                f"(options: {', '.join(sorted(self.options)) or 'none'}; input: {self.input_field})"
            )
        return {
            name: option.parse(payload[name], f"payload.{name}") if name in payload else option.default
            for name, option in self.options.items()
        }

    def options_from_attributes(self, attributes: Mapping[str, str], where: str) -> dict[str, Any]:
        """Typed options from header strings; keys that are not options of this model are ignored."""
        return {
            name: option.parse_text(attributes[name], f"{where} {name}")
            for name, option in self.options.items()
            if name in attributes
        }

    def _items(self, payload: Mapping[str, Any], label: str) -> tuple[list[tuple[Any, str]], bool]:
        if self.input_field not in payload:
            raise InvalidInput(f"{label} is missing")
        value = payload[self.input_field]
        if not isinstance(value, list):
            return [(value, label)], True
        if not value:
            raise InvalidInput(f"{label} is an empty list")
        if len(value) > self.settings.max_batch_items:
            raise InvalidInput(f"{label} has {len(value)} items, over the limit of {self.settings.max_batch_items}")
        return [(item, f"{label}[{i}]") for i, item in enumerate(value)], False

    def _stack(
        self, arrays: Sequence[Mapping[str, np.ndarray]], tensors: Sequence[TensorSpec] | None = None
    ) -> dict[str, np.ndarray]:
        """One Triton request's inputs; a model without batching (max_batch_size 0) has no batch axis."""
        batched = self.spec.max_batch_size > 0
        return {
            tensor.name: (
                stack([a[tensor.name] for a in arrays], tensor.numpy_dtype)
                if batched
                else arrays[0][tensor.name].astype(tensor.numpy_dtype, copy=False)
            )
            for tensor in (self.spec.inputs if tensors is None else tensors)
        }

    def _unstack(
        self, outputs: Mapping[str, np.ndarray], items: Sequence[Mapping[str, np.ndarray]]
    ) -> list[dict[str, np.ndarray]]:
        """Each item's outputs from one Triton answer for the items' arrays (one batch row each)."""
        if self.spec.max_batch_size > 0:
            return [{k: v[i] for k, v in outputs.items()} for i in range(len(items))]
        return [dict(outputs)]

    def _infer(
        self, model: str, inputs: Mapping[str, np.ndarray], output_names: Sequence[str], version: str | None
    ) -> tuple[dict[str, np.ndarray], str]:
        """One Triton call for a chunk's stacked inputs (a family whose items take several rows splits it)."""
        return self.triton.infer(model, inputs, output_names, version)

    def _rows(self, inputs: Mapping[str, np.ndarray]) -> int:
        """The batch rows of a chunk's stacked inputs (one an item, unless a family says otherwise)."""
        if self.spec.max_batch_size <= 0:
            return 1
        return len(next(iter(inputs.values())))

    def _check_outputs(self, outputs: Mapping[str, Any], count: int, tensors: Sequence[TensorSpec]) -> None:
        """Triton's answer has the tensors model.toml promises; anything else is a bug (a 500), never
        a result computed from the wrong numbers."""
        for tensor in tensors:
            array = outputs.get(tensor.name)
            expected = ((count,) if self.spec.max_batch_size > 0 else ()) + tuple(tensor.dims)
            shape = None if array is None else tuple(array.shape)
            if (
                shape is None
                or len(shape) != len(expected)
                or any(want not in (-1, got) for want, got in zip(expected, shape))
            ):
                raise RuntimeError(f"{self.name}: output {tensor.name!r} has shape {shape}, expected {expected}")

    def plan(self, payload: Mapping[str, Any], version: str | None = None, *, label: str | None = None) -> Work:
        """A payload checked (options, items) but not yet computed; ``run`` computes it.

        ``label`` is how error messages name the input (``payload.<field>`` unless given: a raw
        body is "the body")."""
        options = self.parse_options(payload)
        items, single = self._items(payload, label or f"payload.{self.input_field}")
        return Work(options, items, single, self.route(version), version)

    def check(self, work: Work) -> None:
        """The cheap checks of ``check_item`` on each of a work's items, before any work runs: a
        bad line of a JSON Lines body is refused before the other lines' inference is spent."""
        for item, where in work.items:
            self.check_item(item, where)

    def check_item(self, item: Any, where: str) -> None:
        """What can be refused of one item without computing it (a family's own; none by default).
        ``run`` refuses the same items anyway: this only refuses them sooner."""

    def run(
        self, works: Sequence[Work], timings: dict[str, float] | None = None, deadline: float | None = None
    ) -> list[tuple[Any, str]]:
        """Each work's result (a list for a list input) and the version that served it.

        Items of works that take the same route and version go to Triton together, in calls of
        ``max_batch_size``: several payloads (lines of a JSON Lines body) cost the calls one payload
        of all their items would. An error that one work's item caused is raised as ``WorkFailed``
        naming that work; one that no item caused (Triton unavailable, a timeout) as it is.
        ``deadline`` (``time.monotonic()``) is checked before each Triton call. ``timings``, when
        given, gets the seconds spent in ``preprocess``, ``triton`` and ``postprocess``, and the
        family's counts of what it answered (``counted``: its ``Family.counters``).
        """
        results: list[list[Any]] = [[] for _ in works]
        served = [work.version or "" for work in works]
        groups: dict[tuple[str, str | None], list[tuple[int, Any, str]]] = {}
        for index, work in enumerate(works):
            groups.setdefault((work.route.model, work.version), []).extend((index, *item) for item in work.items)
        batch = max(1, self.spec.max_batch_size)
        for (_, version), items in groups.items():
            route = works[items[0][0]].route
            output_names = tuple(t.name for t in route.outputs)
            for start in range(0, len(items), batch):
                chunk = items[start : start + batch]
                with timed(timings, "preprocess"):
                    prepared = [
                        _blamed(index, route.prepare, item, where, works[index].options) for index, item, where in chunk
                    ]
                    inputs = self._stack([arrays for arrays, _ in prepared], route.inputs)
                if deadline is not None and time.monotonic() > deadline:
                    raise InferenceTimeout(
                        f"the request ran past its deadline of {self.settings.server_timeout_s:g} s "
                        f"({SERVER_TIMEOUT}) before all its items reached Triton"
                    )
                with timed(timings, "triton"):
                    try:
                        outputs, answered = self._infer(route.model, inputs, output_names, version)
                    except InvalidItem as error:  # a pipeline step refused one item: name it as the caller does
                        index, _, where = chunk[error.index]
                        refused = InvalidInput(error.message.replace(InvalidItem.WHERE, where))
                        raise WorkFailed(index, refused) from None
                self._check_outputs(outputs, self._rows(inputs), route.outputs)
                with timed(timings, "postprocess"):
                    each = self._unstack(outputs, [arrays for arrays, _ in prepared])
                    for (index, _, _), (_, context), found in zip(chunk, prepared, each):
                        results[index].append(_blamed(index, route.finish, found, context, works[index].options))
                        served[index] = answered
        counts = (pair for found in results for result in found for pair in self.counted(result).items())
        for key, count in counts if timings is not None else ():
            timings[key] = timings.get(key, 0) + count
        return [(found[0] if work.single else found, version) for work, found, version in zip(works, results, served)]

    def counted(self, result: Any) -> Mapping[str, int]:
        """One item's result's counts for the family's ``Family.counters`` (masks), by key; none by default."""
        return {}

    def inference(
        self,
        payload: Mapping[str, Any],
        version: str | None = None,
        *,
        label: str | None = None,
        timings: dict[str, float] | None = None,
    ) -> tuple[Any, str]:
        """The result for a payload (a list of results for a list input) and the version that served it."""
        work = self.plan(payload, version, label=label)
        try:
            return self.run([work], timings)[0]
        except WorkFailed as failed:
            raise failed.error from None


@dataclass(frozen=True)
class Work:
    """One payload of a model, checked: its options, its items (each with how errors name it),
    whether it was one item or a list, the route it takes and the version it names."""

    options: dict[str, Any]
    items: list[tuple[Any, str]]
    single: bool
    route: Route
    version: str | None


class WorkFailed(Exception):
    """``ModelClient.run``: the error that the work at ``index`` caused (its item was refused)."""

    def __init__(self, index: int, error: ApiError) -> None:
        super().__init__(error.message)
        self.index = index
        self.error = error


def _blamed(index: int, step: Any, *args: Any) -> Any:
    """``step(*args)`` for an item of the work at ``index``: a refusal names that work."""
    try:
        return step(*args)
    except ApiError as error:
        raise WorkFailed(index, error) from None
