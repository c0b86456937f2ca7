"""The one question every invocation asks: what serves this name? ``ModelRepository.serving(name)``
answers it with a ``Model`` (the family client, or none for a plain Triton model that takes KServe v2
bodies only) and holds it for as long as the request uses it. Two repositories answer it: the
single-model endpoint's ``Registry`` (its clients, built once at start) and the multi-model
endpoint's ``clients.multimodel.MultiModelStore`` (what SageMaker loaded, held against unloads).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.errors import InvalidInput, UnknownModel
from clients.base import ModelClient


@dataclass(frozen=True)
class Model:
    """A served model: its name, its family client (None: a plain Triton model), the Triton model a
    KServe v2 body for it goes to ("": the one the request names) and the load it belongs to (the
    v2 checks keep a model's configuration per load)."""

    name: str
    client: ModelClient | None
    triton_name: str = ""
    load: object = None

    @property
    def content_types(self) -> frozenset[str]:
        """The raw bodies it takes, besides the JSON forms every model takes."""
        return self.client.content_types if self.client is not None else frozenset()


class ModelRepository(Protocol):
    def serving(self, name: Any) -> Any:
        """A context manager giving the ``Model`` that serves ``name`` and holding it meanwhile;
        UnknownModel (404) when none does, InvalidInput when ``name`` is not a string."""
        ...


class Registry:
    """The single-model endpoint's models: one client per model folder with a model.toml."""

    def __init__(self, clients: Mapping[str, ModelClient]) -> None:
        self.clients = dict(clients)
        self.content_types = frozenset().union(*(client.content_types for client in self.clients.values()))

    def client(self, name: Any) -> ModelClient:
        """The client serving ``name`` (a request's ``modelname``, as it came)."""
        if name is None or name == "":
            raise UnknownModel(f"modelname is missing; served models: {', '.join(sorted(self.clients))}")
        if not isinstance(name, str):
            raise InvalidInput(f"modelname must be a string, got {type(name).__name__}")
        client = self.clients.get(name)
        if client is None:
            raise UnknownModel(f"model {name!r} is not served; served models: {', '.join(sorted(self.clients))}")
        return client

    @contextmanager
    def serving(self, name: Any) -> Iterator[Model]:
        client = self.client(name)
        yield Model(client.name, client)
