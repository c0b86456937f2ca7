"""Multi-model loads in the router without Triton: a fake repository endpoint that holds a load
until told, to see what a second load of the name meets meanwhile and what a failed load leaves."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from app.core import errors
from app.core.settings import Settings
from app.router.multimodel import MultiModel


class SlowTriton:
    """Triton's repository calls and index: each load waits for ``go``; ``fail`` makes them refuse."""

    def __init__(self) -> None:
        self.go, self.started = threading.Event(), threading.Event()
        self.loaded: list[str] = []
        self.fail: errors.ApiError | None = None

    def load(self, name: str, timeout_s: float) -> None:
        self.started.set()
        self.go.wait(10)
        if self.fail is not None:
            raise self.fail
        self.loaded.append(name)

    def unload(self, name: str) -> None:
        self.loaded.remove(name)

    def model_states(self) -> dict[str, str]:
        return {name: "READY" for name in self.loaded}


@pytest.fixture
def plain_model(tmp_path: Path) -> Path:
    folder = tmp_path / "url" / "model"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "plain"\nbackend: "python"\n')
    (folder / "1" / "model.py").write_text("")
    return folder


def test_a_second_load_of_a_name_meets_409_for_the_whole_first_load(tmp_path, plain_model):
    triton = SlowTriton()
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), triton, triton)
    models.store.create()
    first = threading.Thread(target=models.load, args=("m", str(plain_model)))
    first.start()
    assert triton.started.wait(10)  # the first load is inside Triton now
    with pytest.raises(errors.ModelAlreadyLoaded, match="'m' is loading"):
        models.load("m", str(plain_model))
    triton.go.set()
    first.join(10)
    assert models.store.get("m").state == "loaded" and triton.loaded == ["plain"]
    assert (models.store.repository / "plain").is_symlink()


def test_a_load_triton_refuses_leaves_nothing_behind(tmp_path, plain_model):
    triton = SlowTriton()
    triton.go.set()
    triton.fail = errors.InsufficientMemory("Triton could not load 'plain' for want of memory: out of memory")
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), triton, triton)
    models.store.create()
    with pytest.raises(errors.InsufficientMemory):
        models.load("m", str(plain_model))
    assert models.store.all() == [] and list(models.store.repository.iterdir()) == []
    triton.fail = None
    assert models.load("m", str(plain_model)).state == "loaded"  # SageMaker's retry after unloading others


def test_an_unload_triton_fails_leaves_the_model_loaded(tmp_path, plain_model):
    triton = SlowTriton()
    triton.go.set()
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), triton, triton)
    models.store.create()
    models.load("m", str(plain_model))

    def refuse(name: str) -> None:
        raise errors.TritonUnavailable("Triton cannot be reached")

    triton.unload = refuse
    with pytest.raises(errors.TritonUnavailable):
        models.unload("m")
    assert models.store.get("m").state == "loaded"  # SageMaker may send the DELETE again
    del triton.unload  # the class's own again
    models.unload("m")
    assert models.store.all() == [] and list(models.store.repository.iterdir()) == []


def test_what_a_worker_killed_during_an_unload_left_is_cleared_by_the_next_load(tmp_path, plain_model):
    triton = SlowTriton()
    triton.go.set()
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), triton, triton)
    models.store.create()
    record = models.load("m", str(plain_model))
    models.store.save(replace(record, state="unloading", pid=2**22 + 12345))  # no such process
    assert models.load("m", str(plain_model)).state == "loaded"
    assert [r.model_name for r in models.store.all()] == ["m"]
