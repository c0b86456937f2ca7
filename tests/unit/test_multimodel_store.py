"""Multi-model mode's shared state without a stack: what a ``url`` holds (a chain's archive: the chain
to load, its two models to link beside it, its model.toml naming them by their Triton names), the claim
that lets one of two loads of a name win, the memory check, and the hold that makes an unload wait for
requests."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from app.core import errors
from app.core.memory import memory_refusal
from app.core.model_store import (
    LOADED,
    BadLayout,
    ModelStore,
    NoModelThere,
    Record,
    inspect_url,
    triton_names,
)
from app.core.named_models import named_models, renamed
from app.core.procfs import process_tree_memory
from app.core.settings import MIB
from clients.families import FAMILIES


def model(
    folder: Path, name: str | None, *, ensemble_of: tuple[str, ...] = (), spec: bool = False, size: int = 10
) -> Path:
    folder.mkdir(parents=True)
    lines = [f'name: "{name}"'] if name else []
    if ensemble_of:
        lines += ['platform: "ensemble"', "ensemble_scheduling {"]
        lines += [f'  step {{ model_name: "{step}" model_version: -1 }}' for step in ensemble_of]
        lines += ["}"]
    (folder / "config.pbtxt").write_text("\n".join(lines) + "\n")
    (folder / "1").mkdir()
    (folder / "1" / "model.onnx").write_bytes(b"x" * size)
    if spec:
        (folder / "model.toml").write_text('family = "image_classification"\n')
    return folder


def test_a_url_that_is_one_model_folder_is_named_by_its_config(tmp_path):
    url = model(tmp_path / "model", "bert_base", spec=True, size=100)
    layout = inspect_url(str(url), "abc123")
    assert (layout.folders, layout.entry, layout.spec_folder) == ({"bert_base": str(url)}, "bert_base", "bert_base")
    assert layout.size_bytes >= 100
    unnamed = model(tmp_path / "other" / "model", None)
    assert inspect_url(str(unnamed), "abc123").entry == "abc123"  # no name: SageMaker's model name


def test_an_ensemble_with_its_steps_loads_steps_first(tmp_path):
    url = tmp_path / "model"
    model(url / "resnet", "resnet", spec=True)
    model(url / "resnet_preprocess", "resnet_preprocess")
    model(url / "resnet_pipeline", "resnet_pipeline", ensemble_of=("resnet_preprocess", "resnet"))
    layout = inspect_url(str(url), "h")
    assert list(layout.folders) == ["resnet", "resnet_preprocess", "resnet_pipeline"]
    assert (layout.entry, layout.spec_folder) == ("resnet_pipeline", "resnet")


def test_what_is_not_one_model_is_refused_with_its_reason(tmp_path):
    with pytest.raises(NoModelThere, match="is not a folder"):
        inspect_url(str(tmp_path / "nowhere"), "h")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoModelThere, match="no config.pbtxt"):
        inspect_url(str(tmp_path / "empty"), "h")
    model(tmp_path / "two" / "a", "a")
    model(tmp_path / "two" / "b", "b")
    with pytest.raises(BadLayout, match=r"2 models that no ensemble there uses \(a, b\)"):
        inspect_url(str(tmp_path / "two"), "h")
    model(tmp_path / "specs" / "a", "a", spec=True)
    model(tmp_path / "specs" / "b", "b", spec=True)
    model(tmp_path / "specs" / "e", "e", ensemble_of=("a", "b"))
    with pytest.raises(BadLayout, match="2 folders with a model.toml"):
        inspect_url(str(tmp_path / "specs"), "h")
    model(tmp_path / "bad" / "model", "no spaces allowed")
    with pytest.raises(BadLayout, match="cannot name a Triton model"):
        inspect_url(str(tmp_path / "bad" / "model"), "h")


CHAIN_TOML = 'family = "grounded_segmentation"  # a chain\ndetector = "gdino"\nsegmenter = \'sam\' # SAM\n'


def chain_archive(url: Path) -> Path:
    model(url / "gdino", "gdino", size=30)
    (url / "gdino" / "model.toml").write_text('family = "zero_shot_object_detection"\n')
    model(url / "sam", "sam", size=20)
    (url / "sam" / "model.toml").write_text('family = "mask_generation"\n')
    model(url / "chain", "chain", size=5)
    (url / "chain" / "model.toml").write_text(CHAIN_TOML)
    return url


def named(folder: Path):
    return named_models(folder, FAMILIES).values()


def test_a_chain_is_loaded_alone_its_models_linked_beside_it_under_its_prefix(tmp_path):
    url = chain_archive(tmp_path / "model")
    layout = inspect_url(str(url), "grounded", named)
    assert (layout.folders, layout.entry, layout.spec_folder) == ({"chain": str(url / "chain")}, "chain", "chain")
    assert layout.parts == {"gdino": str(url / "gdino"), "sam": str(url / "sam")}
    assert layout.size_bytes >= 55  # the chain opens its models' graphs: their files count
    own = triton_names(layout, "grounded")
    assert set(own.parts) == {own.entry.replace("chain", "gdino"), own.entry.replace("chain", "sam")}
    with pytest.raises(BadLayout, match=r"3 models that no ensemble there uses \(chain, gdino, sam\)"):
        inspect_url(str(url), "grounded")  # without reading what the chain names: three models


def test_a_chains_model_toml_names_its_models_by_their_new_names_and_nothing_else_changes():
    names = {"gdino": "grounded.1a2b3c4d--gdino", "sam": "grounded.1a2b3c4d--sam"}
    text = renamed(CHAIN_TOML, names, FAMILIES)
    assert text == CHAIN_TOML.replace('"gdino"', f'"{names["gdino"]}"').replace("'sam'", f'"{names["sam"]}"')
    assert renamed('family = "mask_generation"\n', names, FAMILIES) == 'family = "mask_generation"\n'
    inline = 'family = "grounded_segmentation"\ndetector = "gdino"\nsegmenter = """sam"""\n'
    with pytest.raises(ValueError, match='segmenter must be written as segmenter = "name" on a line of its own'):
        renamed(inline, names, FAMILIES)


def test_a_linked_chain_reads_its_models_under_their_triton_names(tmp_path):
    url = chain_archive(tmp_path / "model")
    layout = triton_names(inspect_url(str(url), "grounded", named), "grounded")
    store = ModelStore(tmp_path / "state").create()
    parts = {Path(folder).name: triton_name for triton_name, folder in layout.parts.items()}
    store.link(layout.entry, layout.folders[layout.entry], {}, None, lambda text: renamed(text, parts, FAMILIES))
    chain = store.repository / layout.entry
    assert named_models(chain, FAMILIES) == {"detector": parts["gdino"], "segmenter": parts["sam"]}
    assert (url / "chain" / "model.toml").read_text() == CHAIN_TOML  # the archive's file is left as it is
    record = Record("grounded", str(url), folders=layout.folders, parts=layout.parts)
    assert record.linked == [layout.entry, *layout.parts]


def test_the_memory_check():
    assert memory_refusal("m", 10 * MIB, 80 * MIB, 100 * MIB, None) is None
    refused = memory_refusal("m", 30 * MIB, 80 * MIB, 100 * MIB, None)
    assert isinstance(refused, errors.InsufficientMemory) and refused.status == 507
    assert (
        "30.0 MiB" in refused.message
        and "80.0 MiB (what Triton grew by as each loaded) of the 100.0 MiB" in refused.message
    )
    assert memory_refusal("m", 30 * MIB, 0, 0, 20 * MIB).message.endswith("the instance has 20.0 MiB available")
    assert memory_refusal("m", 30 * MIB, 0, 0, None) is None  # no limit, no /proc/meminfo: nothing to check


def _claim(root: str, name: str, results, release=None) -> None:
    """A worker's load: its claim, then (a live worker) waiting until ``release`` is set."""
    try:
        ModelStore(Path(root)).claim(name, "/u")
        results.put("won")
    except errors.ModelAlreadyLoaded:
        results.put("409")
    if release is not None:
        release.wait(10)


def test_of_loads_of_one_name_in_several_processes_exactly_one_wins(tmp_path):
    store = ModelStore(tmp_path).create()
    fork = multiprocessing.get_context("fork")
    results, release = fork.Queue(), fork.Event()
    workers = [fork.Process(target=_claim, args=(str(tmp_path), "m", results, release)) for _ in range(6)]
    for worker in workers:
        worker.start()
    outcomes = sorted(results.get(timeout=10) for _ in workers)
    assert outcomes == ["409"] * 5 + ["won"]
    assert store.get("m").state == "loading"
    with pytest.raises(errors.ModelAlreadyLoaded, match="'m' is loading"):  # the winner is still at it
        store.claim("m", "/u")
    release.set()
    for worker in workers:
        worker.join(10)


def test_an_unload_waits_for_the_requests_holding_the_model(tmp_path):
    store = ModelStore(tmp_path).create()
    store.save(Record(model_name="m", url="/u", state=LOADED, folders={"m": "/u"}, entry="m"))
    events: list[str] = []
    holding = threading.Event()

    def request() -> None:
        with store.serving("m"):
            holding.set()
            time.sleep(0.3)
            events.append("request done")

    caller = threading.Thread(target=request)
    caller.start()
    holding.wait(5)
    store.set_state(store.get("m"), "unloading")
    with pytest.raises(errors.UnknownModel, match="not loaded \\(it is unloading\\)"), store.serving("m"):
        pass
    with store.draining("m", timeout_s=5):
        events.append("drained")
    caller.join()
    assert events == ["request done", "drained"]
    store.forget("m")
    with pytest.raises(errors.UnknownModel, match="'m' is not loaded"), store.serving("m"):
        pass
    assert store.all() == []


def test_the_claim_of_a_worker_killed_during_its_load_is_taken_over(tmp_path):
    store = ModelStore(tmp_path).create()
    dead = multiprocessing.get_context("fork").Process(
        target=_claim, args=(str(tmp_path), "m", multiprocessing.Queue())
    )
    dead.start()
    dead.join(10)
    assert store.get("m").state == "loading" and store.get("m").pid == dead.pid  # its worker is gone
    record = store.claim("m", "/v")
    assert (record.url, record.pid) == ("/v", os.getpid())
    with pytest.raises(errors.ModelAlreadyLoaded, match="'m' is loading"):  # a live worker's claim holds
        store.claim("m", "/w")


GRANDCHILD = """
import os, sys, time
print("started", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
block = bytearray(64 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident
print("ready", flush=True)
time.sleep(60)
"""


def test_the_memory_of_a_process_tree_counts_its_descendants(tmp_path):
    """A model of the python backend lives in a stub process under Triton: the tree's memory is
    what a load charges, so a grandchild's 64 MiB must show in its grandparent's figure."""
    import subprocess
    import sys

    go = tmp_path / "go"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import subprocess, sys, time\n"
                f"subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, {str(go)!r}], stdout=sys.stdout)\n"
                "time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout.readline().strip() == "started"
        before = process_tree_memory(parent.pid)
        go.touch()
        assert parent.stdout.readline().strip() == "ready"
        after = process_tree_memory(parent.pid)
        assert before is not None and after is not None
        assert after - before >= 60 * MIB, (before / MIB, after / MIB)
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
    assert process_tree_memory(parent.pid) is None  # gone: nothing to measure
