"""Multi-model mode (``SAGEMAKER_MULTI_MODEL=true``): what SageMaker asked to load, shared by the
router's worker processes through files.

SageMaker's loader calls ``POST /models {"model_name", "url"}`` on one worker and invokes the
model on any other, so the state lives on disk under ``MULTI_MODEL_DIR``:

- ``repository/``: Triton's model repository (explicit model control). A load links the model's
  folders here under their Triton names; Triton then loads them by name.
- ``loaded/<key>.json``: one record per model name (``key`` is a hash of the name), created with
  ``O_EXCL`` so that of two concurrent loads of one name exactly one wins; its ``state`` is
  ``loading``, ``loaded`` or ``unloading``.
- ``loaded/<key>.lock``: every request for the model holds a shared ``flock`` on it while it
  runs; an unload takes it exclusively, so the requests in flight finish first.

``inspect_url`` reads what a ``url`` holds: one model folder (``config.pbtxt`` at its top), or
several folders making one model (an ensemble and its steps). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

from app.core.errors import InsufficientMemory, ModelAlreadyLoaded, UnknownModel
from app.core.spec import SPEC_FILE

CONFIG_FILE = "config.pbtxt"
LOADING, LOADED, UNLOADING = "loading", "loaded", "unloading"
_NAME = re.compile(r'^\s*name\s*:\s*"([^"]+)"', re.M)
_ENSEMBLE = re.compile(r'^\s*platform\s*:\s*"ensemble"', re.M)
_STEP_MODEL = re.compile(r'\bmodel_name\s*:\s*"([^"]+)"')
TRITON_NAME = re.compile(r"[A-Za-z0-9_.-]+")
MIB = 1024 * 1024


class NoModelThere(UnknownModel):
    """``url`` does not exist or holds no model (404)."""

    code = "model_not_found"


class BadLayout(ValueError):
    """``url`` holds models, but not as one model (400)."""


@dataclass(frozen=True)
class Layout:
    """What a ``url`` holds: its Triton models (name -> folder) in the order to load them (steps
    before the ensembles over them), the one to invoke, the folder with our ``model.toml`` if any,
    and the size of the files (what the model will roughly take in memory)."""

    folders: dict[str, str]
    entry: str
    spec_folder: str | None
    size_bytes: int


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


def inspect_url(url: str, model_name: str) -> Layout:
    """The model at ``url``; a folder without a ``name`` in its config takes ``model_name``."""
    path = Path(url)
    if not path.is_dir():
        raise NoModelThere(f"url {url!r} is not a folder on this instance")
    folders = _model_folders(path)
    if not folders:
        raise NoModelThere(f"url {url!r} holds no model: no {CONFIG_FILE} in it or in its folders")
    configs = {folder: (folder / CONFIG_FILE).read_text(errors="replace") for folder in folders}
    names: dict[str, Path] = {}
    for folder, text in configs.items():
        found = _NAME.search(text)
        name = found.group(1) if found else (folder.name if folder != path else model_name)
        if not TRITON_NAME.fullmatch(name):
            raise BadLayout(f"{folder}: {name!r} cannot name a Triton model (letters, digits, _ . - only)")
        if name in names:
            raise BadLayout(f"url {url!r} holds two models named {name!r}")
        names[name] = folder
    ensembles = {name for name, folder in names.items() if _ENSEMBLE.search(configs[folder])}
    steps = {step for name in ensembles for step in _STEP_MODEL.findall(configs[names[name]])}
    tops = sorted(set(names) - steps)
    if len(tops) != 1:
        raise BadLayout(
            f"url {url!r} holds {len(tops)} models that no ensemble there uses ({', '.join(tops)}): a model of a "
            "multi-model endpoint is one Triton model, or one ensemble with its steps"
        )
    specs = [name for name, folder in names.items() if (folder / SPEC_FILE).is_file()]
    if len(specs) > 1:
        raise BadLayout(f"url {url!r} holds {len(specs)} folders with a {SPEC_FILE} ({', '.join(specs)}): one is one model")
    order = sorted(names, key=lambda name: (name in ensembles, name))
    return Layout(
        folders={name: str(names[name]) for name in order},
        entry=tops[0],
        spec_folder=specs[0] if specs else None,
        size_bytes=sum(_files_size(folder) for folder in folders),
    )


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is no such file."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_refusal(name: str, need: int, loaded: int, limit: int, available: int | None) -> InsufficientMemory | None:
    """The 507 for loading ``need`` bytes next to ``loaded`` ones, or None when it fits both the
    configured limit (0: none) and the memory the machine has available."""
    if limit and loaded + need > limit:
        return InsufficientMemory(
            f"model {name!r} needs about {need / MIB:.1f} MiB (its files); the models loaded take "
            f"{loaded / MIB:.1f} MiB of the {limit / MIB:.1f} MiB MODEL_MEMORY_LIMIT_BYTES allows"
        )
    if available is not None and need > available:
        return InsufficientMemory(
            f"model {name!r} needs about {need / MIB:.1f} MiB (its files); the instance has "
            f"{available / MIB:.1f} MiB available"
        )
    return None


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

    def create(self) -> "ModelStore":
        """Empty folders for a fresh start (Triton starts with nothing loaded)."""
        for folder in (self.repository, self.records):
            folder.mkdir(parents=True, exist_ok=True)
            for item in folder.iterdir():
                if item.is_symlink() or item.is_file():
                    item.unlink()
        return self

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
                raise ModelAlreadyLoaded(f"model {name!r} is {'already loaded' if state == LOADED else state}") from None
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
        for triton_name in record.folders:
            link = self.repository / triton_name
            if link.is_symlink():
                link.unlink()
        self.forget(record.model_name)

    def forget(self, name: str) -> None:
        for path in (self._record_path(name), self._lock_path(name)):
            path.unlink(missing_ok=True)

    def owner_of(self, triton_name: str) -> str | None:
        """The loaded (or loading) model whose Triton models include ``triton_name``."""
        return next((r.model_name for r in self.all() if triton_name in r.folders), None)

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
