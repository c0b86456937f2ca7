"""Multi-model loads in the router without Triton: a fake repository endpoint that holds a load
until told, to see what a second load of the name meets meanwhile and what a failed load leaves."""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.core import errors
from app.core.model_store import triton_prefix
from app.core.pbtxt import parse
from app.core.settings import MIB, Settings
from clients.multimodel import MultiModelStore as MultiModel


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


@pytest.fixture
def ensemble_model(tmp_path: Path) -> Path:
    """Two folders that make one model: ``net`` and the ensemble over it (loaded in that order)."""
    url = tmp_path / "url" / "ensemble"
    for name, config in (
        ("net", 'name: "net"'),
        (
            "net_pipeline",
            ('name: "net_pipeline" platform: "ensemble" ensemble_scheduling { step { model_name: "net" } }'),
        ),
    ):
        (url / name / "1").mkdir(parents=True)
        (url / name / "config.pbtxt").write_text(config)
    return url


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
    assert models.store.get("m").state == "loaded" and triton.loaded == [triton_prefix("m") + "plain"]


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


def test_two_archives_holding_one_folder_name_load_side_by_side_under_names_of_their_own(tmp_path):
    """Two versions of one pipeline (both hold resnet/, resnet_preprocess/, resnet_pipeline/):
    each folder goes into Triton's repository behind its model's prefix, its config renamed
    (name, ensemble steps, the step's source_model), its files linked, nothing else changed."""

    def pipeline(url: Path, weights: bytes) -> Path:
        for name in ("resnet", "resnet_preprocess", "resnet_pipeline"):
            (url / name / "1").mkdir(parents=True)
        (url / "resnet" / "config.pbtxt").write_text('name: "resnet"\nbackend: "onnxruntime"\n')
        (url / "resnet" / "1" / "model.onnx").write_bytes(weights)
        (url / "resnet_preprocess" / "config.pbtxt").write_text(
            'name: "resnet_preprocess"\nbackend: "python"\n'
            'parameters { key: "source_model" value { string_value: "resnet" } }\n'
            'parameters { key: "step" value { string_value: "preprocess" } }\n'
        )
        (url / "resnet_pipeline" / "config.pbtxt").write_text(
            'name: "resnet_pipeline"  # ours\nplatform: "ensemble"\ninput { name: "image" }\nensemble_scheduling {\n'
            '  step { model_name: "resnet_preprocess" model_version: -1 }\n'
            '  step { model_name: "resnet" model_version: -1 }\n}\n'
        )
        return url

    triton = SlowTriton()
    triton.go.set()
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), triton, triton)
    models.store.create()
    for name, weights in (("v1", b"one"), ("v2", b"two")):
        models.load(name, str(pipeline(tmp_path / name / "model", weights)))
    assert [r.model_name for r in models.store.loaded()] == ["v1", "v2"]
    for name, weights in (("v1", b"one"), ("v2", b"two")):
        prefix = triton_prefix(name)
        record = models.store.get(name)
        assert list(record.folders) == [prefix + "resnet", prefix + "resnet_preprocess", prefix + "resnet_pipeline"]
        assert record.entry == prefix + "resnet_pipeline" and triton.loaded.count(record.entry) == 1
        folder = models.store.repository / record.entry
        ensemble = parse((folder / "config.pbtxt").read_text())
        assert ensemble.string("name") == prefix + "resnet_pipeline"
        steps = [
            step.string("model_name") for s in ensemble.messages("ensemble_scheduling") for step in s.messages("step")
        ]
        assert steps == [prefix + "resnet_preprocess", prefix + "resnet"]
        assert [i.string("name") for i in ensemble.messages("input")] == ["image"]  # tensors keep their names
        assert "# ours" in (folder / "config.pbtxt").read_text()
        step = parse((models.store.repository / (prefix + "resnet_preprocess") / "config.pbtxt").read_text())
        values = {
            p.string("key"): next(p.messages("value")).string("string_value") for p in step.messages("parameters")
        }
        assert values == {"source_model": prefix + "resnet", "step": "preprocess"}
        assert (models.store.repository / (prefix + "resnet") / "1" / "model.onnx").read_bytes() == weights
    models.unload("v1")
    assert sorted(p.name for p in models.store.repository.iterdir()) == sorted(models.store.get("v2").folders)
    assert (tmp_path / "v1" / "model" / "resnet" / "1" / "model.onnx").read_bytes() == b"one"  # the url untouched


def test_a_config_that_is_not_protobuf_text_is_a_400_naming_the_file(tmp_path, plain_model):
    (plain_model / "config.pbtxt").write_text('name: "plain"\ninput { name: "x"\n')
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), SlowTriton(), SlowTriton())
    models.store.create()
    with pytest.raises(errors.InvalidInput, match="config.pbtxt cannot be read: a message is not closed"):
        models.load("m", str(plain_model))
    assert models.store.all() == []


def test_a_load_is_bounded_by_the_load_timeout_not_the_request_timeout(tmp_path, ensemble_model):
    """Each Triton load gets what is left of MODEL_LOAD_TIMEOUT; past it, a 504 naming the setting,
    and what was loaded is unloaded."""

    class Timed(SlowTriton):
        def __init__(self, seconds: float) -> None:
            super().__init__()
            self.seconds, self.given = seconds, []
            self.go.set()

        def load(self, name: str, timeout_s: float) -> None:  # as clients.kserve's, which gives up at timeout_s
            self.given.append(timeout_s)
            time.sleep(min(self.seconds, timeout_s))
            if self.seconds > timeout_s:
                raise errors.InferenceTimeout(f"loading {name!r} did not answer within {timeout_s:g} s")
            super().load(name, timeout_s)

    triton = Timed(0.0)
    settings = Settings(
        multi_model=True, multi_model_dir=tmp_path / "state", server_timeout_s=1.0, model_load_timeout_s=300
    )
    models = MultiModel(settings, triton, triton)
    models.store.create()
    models.load("m", str(ensemble_model))
    assert len(triton.given) == 2 and all(299 < t <= 300 for t in triton.given)  # not the 1 s of a request
    models.unload("m")

    triton = Timed(0.6)
    models = MultiModel(replace(settings, model_load_timeout_s=1.0), triton, triton)
    with pytest.raises(
        errors.InferenceTimeout, match=r"loading 'm' did not finish within 1 s: raise MODEL_LOAD_TIMEOUT"
    ):
        models.load("m", str(ensemble_model))
    assert triton.loaded == [] and models.store.all() == [] and list(models.store.repository.iterdir()) == []


def test_a_load_past_its_timeout_does_not_wait_again_for_its_unload(tmp_path, ensemble_model):
    """The unload of what a failed load loaded shares the load's deadline: past it, Triton's index
    is looked at once and the 504 goes out; a Triton that never finishes unloading does not hold
    the answer for another MODEL_LOAD_TIMEOUT."""

    class Stuck(SlowTriton):
        looks = 0

        def load(self, name: str, timeout_s: float) -> None:
            if self.loaded:  # the second folder takes longer than what is left, as clients.kserve gives up
                time.sleep(timeout_s)
                raise errors.InferenceTimeout(f"loading {name!r} did not answer within {timeout_s:g} s")
            self.loaded.append(name)

        def unload(self, name: str) -> None:  # accepted, but the model stays READY
            pass

        def model_states(self) -> dict[str, str]:
            self.looks += 1
            return super().model_states()

    triton = Stuck()
    models = MultiModel(
        Settings(multi_model=True, multi_model_dir=tmp_path / "state", model_load_timeout_s=0.5), triton, triton
    )
    models.store.create()
    with pytest.raises(errors.InferenceTimeout, match="did not finish within 0.5 s"):
        models.load("m", str(ensemble_model))
    assert triton.looks == 1
    assert models.store.all() == [] and list(models.store.repository.iterdir()) == []


def measured(tmp_path: Path, monkeypatch, limit_mib: int) -> tuple[MultiModel, SlowTriton]:
    """A loader whose Triton's processes read 100 MiB before the first load and 400 MiB after it."""
    readings = iter([100 * MIB, 400 * MIB])
    monkeypatch.setattr("clients.multimodel.process_tree_memory", lambda pid: next(readings))
    triton = SlowTriton()
    triton.go.set()
    settings = Settings(
        multi_model=True, multi_model_dir=tmp_path / "state", triton_pid=12345, model_memory_limit_bytes=limit_mib * MIB
    )
    models = MultiModel(settings, triton, triton)
    models.store.create()
    return models, triton


def test_a_loaded_model_is_charged_what_triton_grew_by_not_its_files(tmp_path, plain_model, monkeypatch):
    """Triton's processes measured before and after each load: the growth is what the model holds
    (a python-backend model's stub process included), and what the next load's check adds up."""
    models, _ = measured(tmp_path, monkeypatch, limit_mib=350)
    record = models.load("first", str(plain_model))
    assert (record.memory_bytes, record.charged) == (300 * MIB, 300 * MIB)  # its files are a few bytes
    other = tmp_path / "other" / "model"
    shutil.copytree(plain_model, other)
    (other / "1" / "model.py").write_bytes(b"x" * 60 * MIB)  # fits beside the first's files, not beside 300 MiB
    with pytest.raises(errors.InsufficientMemory, match=r"the models loaded take 300\.0 MiB"):
        models.load("second", str(other))
    models.unload("first")
    monkeypatch.setattr("clients.multimodel.process_tree_memory", lambda pid: None)  # unreadable: files only
    assert models.load("second", str(other)).charged == models.store.get("second").size_bytes >= 60 * MIB


def test_a_model_that_takes_more_than_the_bound_once_loaded_is_unloaded_and_507(tmp_path, plain_model, monkeypatch):
    models, triton = measured(tmp_path, monkeypatch, limit_mib=250)
    with pytest.raises(errors.InsufficientMemory, match=r"'m' took 300\.0 MiB once loaded .* passes the 250\.0 MiB"):
        models.load("m", str(plain_model))  # its files fit: only what Triton took shows it does not
    assert triton.loaded == [] and models.store.all() == [] and list(models.store.repository.iterdir()) == []


@pytest.mark.parametrize(
    ("kills", "expected"),
    [((0, 1), errors.InsufficientMemory), ((4, 4), errors.InvalidInput), ((None, None), errors.InvalidInput)],
)
def test_a_load_refused_while_the_oom_killer_ended_a_process_is_507(
    tmp_path, plain_model, monkeypatch, kills, expected
):
    """A model whose files fit but which, once ONNX Runtime holds it, does not: the kernel kills Triton's
    stub for it and Triton refuses the load (a 400 of its own). Only the OOM killer's count tells the two apart."""
    triton = SlowTriton()
    triton.go.set()
    triton.fail = errors.InvalidInput("failed to load 'plain': Stub process 'plain_0_0' is not healthy.")
    counts = iter(kills)
    monkeypatch.setattr("clients.multimodel.oom_kills", lambda: next(counts))
    models = MultiModel(Settings(multi_model=True, multi_model_dir=tmp_path / "state"), triton, triton)
    models.store.create()
    with pytest.raises(expected) as raised:
        models.load("m", str(plain_model))
    assert "Stub process 'plain_0_0' is not healthy" in raised.value.message
    if expected is errors.InsufficientMemory:
        assert raised.value.status == 507 and "OOM killer ended 1 process(es)" in raised.value.message
    assert models.store.all() == [] and list(models.store.repository.iterdir()) == []  # nothing left behind
