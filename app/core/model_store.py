"""Multi-model mode (``SAGEMAKER_MULTI_MODEL=true``): what SageMaker asked to load, shared by the
router's worker processes through files.

SageMaker's loader calls ``POST /models {"model_name", "url"}`` on one worker and invokes the
model on any other, so the state lives on disk under ``MULTI_MODEL_DIR``:

- ``repository/``: Triton's model repository (explicit model control). A load puts each of the
  model's folders here under a name of its own (``triton_names``: the folder's name behind a
  prefix made from the model's name, so that two archives holding a ``resnet/`` load side by
  side): a folder of links to the files, with the ``config.pbtxt`` renamed (``app.core.pbtxt``).
- ``loaded/<key>.json``: one record per model name (``key`` is a hash of the name), created with
  ``O_EXCL`` so that of two concurrent loads of one name exactly one wins; its ``state`` is
  ``loading``, ``loaded`` or ``unloading``.
- ``loaded/<key>.lock``: every request for the model holds a shared ``flock`` on it while it
  runs; an unload takes it exclusively, so the requests in flight finish first.

``inspect_url`` reads what a ``url`` holds: one model folder (``config.pbtxt`` at its top), or
several folders making one model (an ensemble and its steps; a chain and the models its model.toml
names, ``app.core.named_models``: those are linked beside it under its prefix, not loaded into Triton,
since the chain opens their graphs itself). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from app.core import pbtxt
from app.core.errors import ModelAlreadyLoaded, UnknownModel
from app.core.spec import SPEC_FILE

CONFIG_FILE = "config.pbtxt"
LOADING, LOADED, UNLOADING = "loading", "loaded", "unloading"
TRITON_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
PREFIX_END = "--"


class NoModelThere(UnknownModel):
    """``url`` does not exist or holds no model (404)."""

    code = "model_not_found"


class BadLayout(ValueError):
    """``url`` holds models, but not as one model (400)."""


@dataclass(frozen=True)
class Layout:
    """What a ``url`` holds: its Triton models (name -> folder) in the order to load them (steps
    before the ensembles over them), the one to invoke, the folder with our ``model.toml`` if any,
    the size of the files (what the model will roughly take in memory), and the models a chain names
    (name -> folder: linked beside it, not loaded)."""

    folders: dict[str, str]
    entry: str
    spec_folder: str | None
    size_bytes: int
    parts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Record:
    """A model SageMaker asked to load: its name and url, what ``inspect_url`` found, its state."""

    model_name: str
    url: str
    state: str = LOADING
    folders: dict[str, str] = field(default_factory=dict)
    entry: str = ""
    spec_folder: str | None = None  # the linked folder holding model.toml; None: a plain Triton model
    size_bytes: int = 0
    since: float = 0.0
    pid: int = 0  # the worker that loads it: a claim whose worker died is taken over
    memory_bytes: int = 0  # what Triton's processes grew by while it loaded (0: not measured)
    parts: dict[str, str] = field(default_factory=dict)  # a chain's models: linked, not loaded in Triton

    @property
    def linked(self) -> list[str]:
        """Every name it links into Triton's repository: its Triton models, then a chain's models."""
        return [*self.folders, *self.parts]

    @property
    def charged(self) -> int:
        """The memory the model is taken to hold: what its load measured, or its files where more."""
        return max(self.size_bytes, self.memory_bytes)

    def listing(self) -> dict[str, str]:
        """The contract's description of a loaded model."""
        return {"modelName": self.model_name, "modelUrl": self.url}


def _model_folders(url: Path) -> list[Path]:
    if (url / CONFIG_FILE).is_file():
        return [url]
    return sorted(p for p in url.iterdir() if p.is_dir() and (p / CONFIG_FILE).is_file())


def _files_size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder, followlinks=True):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_size
    return total


def inspect_url(url: str, model_name: str, named: Callable[[Path], Iterable[str]] = lambda _: ()) -> Layout:
    """The model at ``url``; a folder without a ``name`` in its config takes ``model_name``. ``named``:
    the folders a model folder's model.toml names (a chain's models, ``app.core.named_models``)."""
    path = Path(url)
    if not path.is_dir():
        raise NoModelThere(f"url {url!r} is not a folder on this instance")
    folders = _model_folders(path)
    if not folders:
        raise NoModelThere(f"url {url!r} holds no model: no {CONFIG_FILE} in it or in its folders")
    configs: dict[Path, pbtxt.Message] = {}
    for folder in folders:
        try:
            configs[folder] = pbtxt.parse((folder / CONFIG_FILE).read_text(errors="replace"))
        except pbtxt.PbtxtError as error:
            raise BadLayout(f"{folder / CONFIG_FILE} cannot be read: {error}") from None
    names: dict[str, Path] = {}
    for folder, config in configs.items():
        name = config.string("name") or (folder.name if folder != path else model_name)
        if not TRITON_NAME.fullmatch(name):
            raise BadLayout(f"{folder}: {name!r} cannot name a Triton model (letters, digits, _ . - only)")
        if name in names:
            raise BadLayout(f"url {url!r} holds two models named {name!r}")
        names[name] = folder
    ensembles = {name for name, folder in names.items() if pbtxt.is_ensemble(configs[folder])}
    steps = {step for name in ensembles for step in pbtxt.step_models(configs[names[name]])}
    by_folder = {folder.name: name for name, folder in names.items()}  # a chain names its models' folders
    parts = {by_folder[part] for folder in folders for part in named(folder) if part in by_folder}
    tops = sorted(set(names) - steps - parts)
    if len(tops) != 1:
        raise BadLayout(
            f"url {url!r} holds {len(tops)} models that no ensemble there uses ({', '.join(tops)}): a model of a "
            "multi-model endpoint is one Triton model, or one ensemble with its steps"
        )
    specs = [name for name, folder in names.items() if (folder / SPEC_FILE).is_file() and name not in parts]
    if len(specs) > 1:
        raise BadLayout(
            f"url {url!r} holds {len(specs)} folders with a {SPEC_FILE} ({', '.join(specs)}): one is one model"
        )
    order = sorted(set(names) - parts, key=lambda name: (name in ensembles, name))
    return Layout(
        folders={name: str(names[name]) for name in order},
        entry=tops[0],
        spec_folder=specs[0] if specs else None,
        size_bytes=sum(_files_size(folder) for folder in folders),
        parts={name: str(names[name]) for name in sorted(parts)},
    )


def triton_prefix(model_name: str) -> str:
    """What goes before the Triton names of a model's folders: its name made safe for Triton
    (shortened), a hash of the whole name (two names never share it), ``--``."""
    digest = hashlib.sha256(model_name.encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', model_name)[:40]}.{digest}{PREFIX_END}"


def triton_names(layout: Layout, model_name: str) -> Layout:
    """``layout`` with every Triton name (folders, entry, the model.toml folder, a chain's models)
    behind the model's prefix."""
    prefix = triton_prefix(model_name)
    return replace(
        layout,
        folders={prefix + name: folder for name, folder in layout.folders.items()},
        parts={prefix + name: folder for name, folder in layout.parts.items()},
        entry=prefix + layout.entry,
        spec_folder=prefix + layout.spec_folder if layout.spec_folder else None,
    )


def own_name(triton_name: str, model_name: str) -> str:
    """The name a folder of ``model_name`` has in its archive, from its Triton name (``triton_names``)."""
    return triton_name.removeprefix(triton_prefix(model_name))


def link_folder(
    target: Path, folder: Path, config: Callable[[str], str], spec: Callable[[str], str] | None = None
) -> None:
    """``target``: a new folder of links to the files of ``folder``, and its config.pbtxt's text
    through ``config`` (its model.toml's through ``spec``, where given). Folders are made, not
    linked, so that what runs from them (a python model's ``__pycache__``) writes here, never into
    ``folder``, which may be read-only. ``FileExistsError`` when ``target`` exists."""
    target.mkdir()
    edits = {CONFIG_FILE: config, **({SPEC_FILE: spec} if spec else {})}
    for entry in folder.iterdir():
        if entry.name in edits and entry.is_file():
            (target / entry.name).write_text(edits[entry.name](entry.read_text(errors="replace")))
        elif entry.is_dir() and entry.name != "__pycache__":
            _mirror(entry, target / entry.name)
        elif entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry.absolute())


def _mirror(folder: Path, target: Path) -> None:
    target.mkdir()
    for entry in folder.iterdir():
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            _mirror(entry, target / entry.name)
        else:
            (target / entry.name).symlink_to(entry.absolute())


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ModelStore:
    """The records of loaded models under ``root/loaded`` and Triton's repository ``root/repository``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.repository = self.root / "repository"
        self.records = self.root / "loaded"

    def create(self) -> ModelStore:
        """Empty folders for a fresh start (Triton starts with nothing loaded)."""
        for folder in (self.repository, self.records):
            folder.mkdir(parents=True, exist_ok=True)
        for item in self.repository.iterdir():
            self.unlink(item.name)
        for item in self.records.iterdir():
            item.unlink()
        return self

    def link(
        self,
        triton_name: str,
        folder: str,
        names: dict[str, str],
        edit: Callable[[str], str] | None = None,
        spec: Callable[[str], str] | None = None,
    ) -> None:
        """``repository/<triton_name>``: links to the files of ``folder``, and its config.pbtxt
        with the model names in ``names`` replaced (``pbtxt.rename``), then ``edit``ed (the sizing);
        its model.toml through ``spec`` where given (a chain's, naming its models' Triton names).
        ``FileExistsError`` when the name is taken; what was made is removed if a step fails."""
        try:
            link_folder(
                self.repository / triton_name,
                Path(folder),
                lambda text: (edit or str)(pbtxt.rename(text, names)),
                spec,
            )
        except FileExistsError:
            raise
        except BaseException:
            self.unlink(triton_name)
            raise

    def unlink(self, triton_name: str) -> None:
        """What ``link`` made (nothing where there is nothing)."""
        path = self.repository / triton_name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)

    def _key(self, name: str) -> str:
        return hashlib.sha256(name.encode()).hexdigest()[:32]

    def _record_path(self, name: str) -> Path:
        return self.records / f"{self._key(name)}.json"

    def _lock_path(self, name: str) -> Path:
        return self.records / f"{self._key(name)}.lock"

    def claim(self, name: str, url: str) -> Record:
        """The record of a load about to start; 409 when the name is loaded, or being loaded or
        unloaded by a worker still alive (what a worker killed meanwhile left is cleared first)."""
        record = Record(model_name=name, url=url, since=time.time(), pid=os.getpid())
        for attempt in range(2):
            try:
                fd = os.open(self._record_path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                current = self.get(name)
                state = current.state if current else LOADING
                if attempt == 0 and current is not None and state != LOADED and not _alive(current.pid):
                    self._clear(current)
                    continue
                raise ModelAlreadyLoaded(
                    f"model {name!r} is {'already loaded' if state == LOADED else state}"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(record), f)
            return record
        raise ModelAlreadyLoaded(f"model {name!r} is loading")

    def save(self, record: Record) -> Record:
        path = self._record_path(record.model_name)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(asdict(record)))
        temporary.replace(path)
        return record

    def set_state(self, record: Record, state: str) -> Record:
        """The record in its new state, held by this worker (a load's or an unload's)."""
        return self.save(replace(record, state=state, pid=os.getpid()))

    def get(self, name: str) -> Record | None:
        try:
            return Record(**json.loads(self._record_path(name).read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def all(self) -> list[Record]:
        found = []
        for path in self.records.glob("*.json"):
            with contextlib.suppress(FileNotFoundError, ValueError):
                found.append(Record(**json.loads(path.read_text())))
        return sorted(found, key=lambda r: r.model_name)

    def loaded(self) -> list[Record]:
        return [record for record in self.all() if record.state == LOADED]

    def _clear(self, record: Record) -> None:
        """A dead worker's unfinished load or unload: its links and its record."""
        for triton_name in record.linked:
            self.unlink(triton_name)
        self.forget(record.model_name)

    def forget(self, name: str) -> None:
        for path in (self._record_path(name), self._lock_path(name)):
            path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def serving(self, name: str) -> Iterator[Record]:
        """The loaded model's record, held (shared) while a request for it runs; 404 when the name
        is not loaded, or is being unloaded."""
        if self.get(name) is None:
            raise UnknownModel(f"model {name!r} is not loaded")
        with self._lock_path(name).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            record = self.get(name)
            if record is None or record.state != LOADED:
                state = f" (it is {record.state})" if record else ""
                raise UnknownModel(f"model {name!r} is not loaded{state}")
            yield record

    @contextlib.contextmanager
    def draining(self, name: str, timeout_s: float) -> Iterator[None]:
        """Wait (up to ``timeout_s``) until no request holds the model, then hold it exclusively."""
        with self._lock_path(name).open("a") as lock:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break  # a request that hangs past the router's own deadline does not block SageMaker
                    time.sleep(0.05)
            yield
