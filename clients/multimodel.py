"""Multi-model mode's models, framework-free (the router's ``app.router.models_api`` maps SageMaker's
``/models`` API onto it): load a model from a folder (claim its name, link its folders into Triton's
repository under names of its own, load them, charge it the memory Triton grew by, or undo it all
with a 4xx/5xx), unload it after the requests in flight, and hold a loaded model while a request
uses it (``serving``, the ``ModelRepository`` question the single-model ``Registry`` answers too).
The state is shared by the router's workers through ``app.core.model_store.ModelStore``; each worker
keeps the clients it built, keyed by the load they belong to. A model folder with a ``model.toml``
gets its family's client; a plain Triton model is served through KServe v2 only. A chain's archive
(``grounded_segmentation``) carries the models its model.toml names: they are linked beside it under
its prefix, the chain's model.toml naming them by those names, and only the chain is loaded into
Triton (it opens their graphs itself).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from app.core import machine
from app.core.errors import ApiError, InferenceTimeout, InvalidInput, NotFound, TritonUnavailable
from app.core.health import Readiness
from app.core.memory import memory_overrun, memory_refusal, oom_refusal
from app.core.model_store import (
    LOADED,
    UNLOADING,
    BadLayout,
    Layout,
    ModelStore,
    Record,
    inspect_url,
    own_name,
    triton_names,
)
from app.core.named_models import named_models, renamed
from app.core.procfs import available_memory, oom_kills, process_tree_memory
from app.core.settings import MODEL_LOAD_TIMEOUT, Settings
from app.core.spec import SpecError
from clients import sized_configs
from clients.base import ModelClient, Triton
from clients.families import FAMILIES, load_spec, make_client
from clients.kserve import TritonHttp
from clients.serving import Model

log = logging.getLogger("clients.multimodel")

UNLOAD_POLL_S = 0.1


class TritonRepository(Triton, Readiness, Protocol):
    """Inference for the clients, and the repository index an unload waits on (``TritonClient``)."""


class MultiModelStore:
    """The loaded models as this worker sees them: the shared records (``ModelStore``), and its own
    clients, built once per load. A ``ModelRepository``: ``serving(name)`` holds a loaded model."""

    def __init__(self, settings: Settings, triton: TritonRepository, kserve: TritonHttp) -> None:
        self.settings, self.triton, self.kserve = settings, triton, kserve
        self.store = ModelStore(settings.multi_model_dir)
        self._clients: dict[str, tuple[float, ModelClient]] = {}
        self._machine: machine.Machine | None = None  # what a load is sized for, found at the first

    def client(self, record: Record) -> ModelClient | None:
        """The family client of a loaded model (None for a plain Triton model), built once per load."""
        if record.spec_folder is None:
            return None
        cached = self._clients.get(record.model_name)
        if cached is None or cached[0] != record.since:
            spec = load_spec(self.store.repository / record.spec_folder)
            spec = replace(spec, name=own_name(spec.name, record.model_name))  # its Triton name stays spec.triton_name
            cached = self._clients[record.model_name] = (record.since, make_client(spec, self.triton, self.settings))
        return cached[1]

    def load(self, name: str, url: str) -> Record:
        deadline = time.monotonic() + self.settings.model_load_timeout_s
        record = self.store.claim(name, url)  # 409 for the second of two loads of one name
        loaded: list[str] = []
        layout: Layout | None = None
        try:
            try:
                found = inspect_url(url, name, lambda folder: named_models(folder, FAMILIES).values())
            except BadLayout as error:
                raise InvalidInput(str(error)) from None
            self._check_spec(found)
            others = sum(r.charged for r in self.store.all() if r.model_name != name)
            refused = memory_refusal(
                name, found.size_bytes, others, self.settings.model_memory_limit_bytes, available_memory()
            )
            if refused is not None:
                raise refused
            layout = triton_names(found, name)
            record = self.store.save(
                replace(
                    record,
                    folders=layout.folders,
                    entry=layout.entry,
                    spec_folder=layout.spec_folder,
                    size_bytes=layout.size_bytes,
                    parts=layout.parts,
                )
            )
            renamed = dict(zip(found.folders, layout.folders)) | dict(zip(found.parts, layout.parts))
            sized = self._sized(name, found, renamed)
            parts = {Path(folder).name: triton_name for triton_name, folder in layout.parts.items()}
            for triton_name, folder in {**layout.parts, **layout.folders}.items():
                self.store.unlink(triton_name)  # the name is this model's alone: only a killed load's leftovers
                text = sized.get(triton_name)
                self.store.link(
                    triton_name,
                    folder,
                    renamed,
                    None if text is None else lambda _, text=text: text,
                    self._spec_text(parts) if triton_name == layout.spec_folder and parts else None,
                )
            before, kills = self._triton_memory(), oom_kills()
            for triton_name in layout.folders:
                try:
                    self._load_one(name, triton_name, deadline)
                except InvalidInput as error:  # Triton refused the load: for lack of memory?
                    raise oom_refusal(name, kills, oom_kills(), error.message) or error from None
                loaded.append(triton_name)
            record = self._measured(record, before, others)
            return self.store.set_state(record, LOADED)
        except BaseException:
            self._quietly_unload(list(reversed(loaded)), deadline)
            for triton_name in [*layout.folders, *layout.parts] if layout else ():
                self.store.unlink(triton_name)
            self.store.forget(name)
            raise

    def _sized(self, name: str, found: Layout, renamed: dict[str, str]) -> dict[str, str]:
        """The configs of the model's Triton models sized for this machine beside the models loaded
        already (``clients.sized_configs.size_load``), by Triton name; the plan is logged."""
        if self._machine is None:
            self._machine = machine.detect()
        loaded = {
            triton_name: self.store.repository / triton_name
            for record in self.store.all()
            if record.model_name != name
            for triton_name in record.folders
            if (self.store.repository / triton_name).is_dir()
        }
        new = {own: Path(folder) for own, folder in found.folders.items()}
        try:
            plan, texts = sized_configs.size_load(self._machine, loaded, new, renamed, os.environ)
        except ValueError as error:  # a GPU model on a machine without one, a bad count variable
            raise InvalidInput(f"model {name!r} cannot be sized for this machine: {error}") from None
        log.info(
            "sized %s beside %d loaded Triton models: %s",
            name,
            len(loaded),
            ", ".join(f"{n} {p.count} x {p.threads or 1}" for n, p in ((n, plan.part(n)) for n in texts))
            or "nothing to size",
            extra={"fields": {"sizing": plan.record()}},
        )
        return texts

    @staticmethod
    def _spec_text(parts: dict[str, str]):
        """A chain's model.toml naming its models by their Triton names; a file that cannot be so
        written is a 400 naming it."""

        def edit(text: str) -> str:
            try:
                return renamed(text, parts, FAMILIES)
            except ValueError as error:
                raise InvalidInput(str(error)) from None

        return edit

    def _triton_memory(self) -> int | None:
        """What Triton's processes take now (None when its pid is not known, or cannot be read)."""
        return process_tree_memory(self.settings.triton_pid) if self.settings.triton_pid else None

    def _measured(self, record: Record, before: int | None, others: int) -> Record:
        """The record with what Triton grew by while it loaded (two loads at once each count both:
        on the safe side); a 507 when that passes the bound its files fitted, so the load is undone."""
        after = self._triton_memory()
        if before is None or after is None:
            return record
        record = replace(record, memory_bytes=max(0, after - before))
        overrun = memory_overrun(record, others, self.settings.model_memory_limit_bytes)
        if overrun is not None:
            raise overrun
        return record

    def _load_one(self, name: str, triton_name: str, deadline: float) -> None:
        """One of the model's Triton models, within what is left of MODEL_LOAD_TIMEOUT (a 504 past it)."""
        late = InferenceTimeout(
            f"loading {name!r} did not finish within {self.settings.model_load_timeout_s:g} s: "
            f"raise {MODEL_LOAD_TIMEOUT} for models that take Triton longer to load"
        )
        left = deadline - time.monotonic()
        if left <= 0:
            raise late
        try:
            self.kserve.load(triton_name, left)
        except InferenceTimeout:
            raise late from None

    def _check_spec(self, layout: Layout) -> None:
        """A model.toml that would not serve is a 400 naming the file and the key, before anything is loaded."""
        if layout.spec_folder is None:
            return
        folder = layout.folders[layout.spec_folder]
        try:
            make_client(load_spec(folder), self.triton, self.settings)
        except SpecError as error:
            raise InvalidInput(str(error)) from None
        except (OSError, ValueError, KeyError) as error:
            raise InvalidInput(f"{folder}/model.toml cannot be served: {error}") from None

    def _quietly_unload(self, triton_names: list[str], deadline: float) -> None:
        """What a failed load loaded, given back before its 507 or 504 is answered: SageMaker
        retries at once, and that load's memory reading must not count these. The wait shares the
        load's deadline, so a load past MODEL_LOAD_TIMEOUT answers its 504 at once."""
        try:
            for triton_name in triton_names:
                self.kserve.unload(triton_name)
            if triton_names:
                self._wait_unloaded(triton_names, deadline)
        except ApiError as error:
            log.warning("could not unload %s after a failed load: %s", ", ".join(triton_names), error.message)

    def unload(self, name: str) -> None:
        record = self.store.get(name)
        if record is None or record.state != LOADED:
            raise NotFound(f"model {name!r} is not loaded")
        self.store.set_state(record, UNLOADING)  # from here on, its requests get 404
        with self.store.draining(name, self.settings.server_timeout_s + 5):
            try:
                for triton_name in reversed(list(record.folders)):  # the ensemble first, then its steps
                    self.kserve.unload(triton_name)
                self._wait_unloaded(list(record.folders), time.monotonic() + self.settings.model_load_timeout_s)
            except ApiError:
                self.store.save(record)  # still loaded as far as SageMaker can tell: it may try again
                raise
            for triton_name in record.linked:
                self.store.unlink(triton_name)
            self.store.forget(name)
        self._clients.pop(name, None)

    @contextmanager
    def serving(self, name: Any) -> Iterator[Model]:
        """The loaded model ``name``, held (an unload waits) until the block ends; 404 when it is not loaded."""
        with self.store.serving(name) as record:
            yield Model(name, self.client(record), record.entry, record.since)

    def _wait_unloaded(self, names: list[str], deadline: float) -> None:
        """Triton unloads in the background: wait until none of ``names`` is READY or UNLOADING
        (looked at once at least, then until ``deadline``)."""
        while True:
            states = self.triton.model_states()
            if not any(states.get(n) in ("READY", "UNLOADING") for n in names):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(UNLOAD_POLL_S)
        raise TritonUnavailable(
            f"Triton did not finish unloading {', '.join(names)} within "
            f"{self.settings.model_load_timeout_s:g} s ({MODEL_LOAD_TIMEOUT})"
        )
