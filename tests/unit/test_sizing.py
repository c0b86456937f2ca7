"""The sizing's rules (app/core/sizing.py) on a table of machines: 1.5 CPUs by cgroup quota, 2 to 192
vCPUs, 0 to 8 GPUs with and without a JPEG engine, every SageMaker instance type the project names.
The CPU threads a plan hands out stay within the budget wherever the floors do; a value model.toml
gives, and one an environment variable gives, win over "auto"."""

from __future__ import annotations

import pytest

from app.core import sizing
from app.core.machine import INSTANCE_TYPES, Gpu, Machine
from app.core.settings import PROJECT_ROOT
from app.core.sizing import CPU_NETWORK, DALI, GPU_NETWORK, PYTHON_STEP, Part, plan
from clients.families import load_spec
from clients.sized_configs import fixed, parts_from_specs

H100, A10G = Gpu("NVIDIA H100 80GB HBM3", True), Gpu("NVIDIA A10G", False)
MODELS = ("resnet", "yolov5", "bert_base")


def specs():
    return {name: load_spec(PROJECT_ROOT / "models" / name) for name in MODELS}


def shipped(machine: Machine, target: str | None = None) -> sizing.Plan:
    """The shipped models' plan, prepared for tensorrt on a GPU machine and python on a CPU one."""
    target = target or ("tensorrt" if machine.gpus else "python")
    return plan(machine, parts_from_specs(specs(), target, machine))


# vCPUs, GPUs -> router workers, NGINX workers, {Triton model: (count, threads)}: the rules' answers,
# worked out by hand from CPU_MS and the floors (a change of a rule changes these on purpose).
CASES = {
    "1.5 CPUs (cgroup quota)": (
        Machine(1.5),
        2,
        1,
        {"resnet": (1, 1), "resnet_preprocess": (1, 0), "bert_base": (1, 1)},
    ),
    # 2 to 8: the floors (router 2, NGINX 1, 3 networks, 2 steps: 8) take the whole budget, so each
    # network may use up to CROWDED_NETWORK_CPUS (4) of it while it runs: 2 x 1 on 2 vCPUs, 2 x 2 above
    "2 vCPUs": (Machine(2), 2, 1, {"resnet": (2, 1), "yolov5_preprocess": (1, 0), "bert_base": (2, 1)}),
    "4 vCPUs": (Machine(4), 2, 1, {"resnet": (2, 2), "yolov5": (2, 2)}),
    "8 vCPUs": (Machine(8), 2, 1, {"resnet": (2, 2), "yolov5": (2, 2), "bert_base": (2, 2)}),
    # 16: floors 8, the other 8 by CPU ms (4 : 0.26 : 20 x 3 : 5 x 2): each network +2, then the
    # largest remainders (the networks', 0.16) +1 to bert_base and resnet; 3 CPUs are 3 x 1
    "16 vCPUs": (
        Machine(16),
        2,
        1,
        {"resnet": (2, 2), "yolov5": (3, 1), "bert_base": (2, 2), "resnet_preprocess": (1, 0)},
    ),
    # 48: networks 13, 12, 12 CPUs (6 x 2; bert_base's odd one goes back to the router), steps 3, router 4 + 1
    "48 vCPUs": (Machine(48), 5, 1, {"resnet": (6, 2), "bert_base": (6, 2), "resnet_preprocess": (3, 0)}),
    "96 vCPUs": (Machine(96), 11, 1, {"resnet": (8, 3), "bert_base": (8, 3), "yolov5_preprocess": (6, 0)}),
    "192 vCPUs": (Machine(192), 21, 1, {"resnet": (8, 6), "bert_base": (8, 6), "resnet_preprocess": (13, 0)}),
    "8 vCPUs, 1 A10G": (
        Machine(8, (A10G,)),
        2,
        1,
        {"resnet": (2, 0), "resnet_preprocess": (1, 3), "yolov5_preprocess": (1, 2)},
    ),
    # 16 + H100: floors 5, the other 11 by 4 : 0.26 : 1.4 : 1.4 (DALI's CPU with a JPEG engine): router 9, DALI 3 each
    "16 vCPUs, 1 H100": (
        Machine(16, (H100,)),
        9,
        1,
        {"resnet": (2, 0), "resnet_preprocess": (1, 3), "yolov5_preprocess": (1, 3)},
    ),
    "48 vCPUs, 4 A10G": (Machine(48, (A10G,) * 4), 15, 1, {"bert_base": (2, 0), "yolov5_preprocess": (2, 2)}),
    "96 vCPUs, 8 H100": (Machine(96, (H100,) * 8), 61, 3, {"resnet_preprocess": (1, 2), "yolov5": (2, 0)}),
}


@pytest.mark.parametrize("case", CASES)
def test_the_rules_give_the_documented_counts(case):
    machine, router, nginx, counts = CASES[case]
    got = shipped(machine)
    print(
        f"{case}: router {got.router_workers}, NGINX {got.nginx_workers}, "
        + ", ".join(f"{p.triton_name} {p.count}x{p.threads}" for p in got.parts)
    )
    assert (got.router_workers, got.nginx_workers) == (router, nginx)
    for name, (count, threads) in counts.items():
        part = got.part(name)
        assert (part.count, part.threads) == (count, threads), name


MACHINES = [
    Machine(vcpus, gpus)
    for vcpus in (1.5, 2, 4, 8, 16, 48, 96, 192)
    for gpus in ((), (A10G,), (H100,), (A10G,) * 4, (H100,) * 4, (A10G,) * 8, (H100,) * 8)
] + list(INSTANCE_TYPES.values())


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: f"{m.vcpus:g}cpu-{m.gpu_count}x{m.gpu_model or 'none'}")
@pytest.mark.parametrize("target", ["python", "onnxruntime", "tensorrt"])
def test_the_threads_handed_out_stay_within_the_budget(machine, target):
    if target == "tensorrt" and not machine.gpus:
        with pytest.raises(ValueError, match="need a GPU"):
            shipped(machine, target)
        return
    got = shipped(machine, target)
    assert got.cpu_threads == got.router_workers + got.nginx_workers + sum(p.cpu for p in got.parts)
    networks = [p for p in got.parts if p.kind == CPU_NETWORK]
    if got.floors < got.budget:
        assert got.cpu_threads <= got.budget and not got.notes
    else:  # the floors take the budget: every part at its floor but the CPU networks, and the plan says so
        crowded = min(got.budget, sizing.CROWDED_NETWORK_CPUS)
        assert all(p.cpu == crowded for p in networks)
        assert got.cpu_threads == got.floors + sum(p.cpu - 1 for p in networks)
        if got.cpu_threads > got.budget:
            assert "oversubscribed" in got.notes[0]
    for part in got.parts:
        assert part.count >= 1 and (part.kind in (PYTHON_STEP, GPU_NETWORK) or part.threads >= 1)
        if part.kind == DALI:
            assert part.count <= sizing.DALI_MAX_COPIES[machine.jpeg_engine] and part.threads <= sizing.DALI_MAX_THREADS
        if part.kind == CPU_NETWORK:
            assert part.count <= sizing.CPU_NETWORK_MAX_INSTANCES
    assert sizing.ROUTER_MIN_WORKERS <= got.router_workers <= sizing.ROUTER_MAX_WORKERS


def test_every_instance_type_has_its_vcpus_and_gpus():
    assert INSTANCE_TYPES["ml.g5.xlarge"].gpu_count == 1 and not INSTANCE_TYPES["ml.g5.xlarge"].jpeg_engine
    assert INSTANCE_TYPES["ml.g4dn.xlarge"].gpu_model == "Tesla T4" and not INSTANCE_TYPES["ml.g4dn.xlarge"].jpeg_engine
    assert INSTANCE_TYPES["ml.g6.xlarge"].jpeg_engine and INSTANCE_TYPES["ml.p5.48xlarge"].jpeg_engine
    assert (INSTANCE_TYPES["ml.p4d.24xlarge"].vcpus, INSTANCE_TYPES["ml.p4d.24xlarge"].gpu_count) == (96, 8)
    assert (INSTANCE_TYPES["ml.c5.4xlarge"].vcpus, INSTANCE_TYPES["ml.c5.4xlarge"].gpus) == (16, ())
    for name in ("ml.g5.2xlarge", "ml.g5.12xlarge", "ml.m5.xlarge", "ml.p5.48xlarge"):
        assert name in INSTANCE_TYPES


def test_a_model_toml_value_wins_over_auto(tmp_path):
    folder = tmp_path / "resnet"
    folder.mkdir()
    text = (PROJECT_ROOT / "models" / "resnet" / "model.toml").read_text()
    text = text.replace('[instances]\ncount = "auto"', "[instances]\ncount = 3\nthreads = 5\npreprocess = 4")
    (folder / "model.toml").write_text(text)
    spec = load_spec(folder)
    assert (spec.instance_count, spec.threads, spec.preprocess_instances) == (3, 5, 4)
    got = plan(Machine(16), parts_from_specs({"resnet": spec}, "python", Machine(16)))
    assert (got.part("resnet").count, got.part("resnet").threads, got.part("resnet_preprocess").count) == (3, 5, 4)
    assert got.part("resnet").why == "given"
    dali = plan(Machine(16, (H100,)), parts_from_specs({"resnet": spec}, "tensorrt", Machine(16, (H100,))))
    assert dali.part("resnet").count == 3 and dali.part("resnet_preprocess").count == 4  # 3 per GPU, 4 copies


def test_an_environment_variable_wins_over_auto_and_over_model_toml():
    env = {
        "TRITON_INSTANCES": "resnet=5,yolov5_preprocess=3",
        "TRITON_THREADS": "4",
        "MODEL_SERVER_WORKERS": "7",
        "NGINX_WORKERS": "2",
    }
    parts = [
        Part("resnet", "resnet", CPU_NETWORK, instances=2),
        Part("yolov5_preprocess", "yolov5", PYTHON_STEP),
        Part("bert_base", "bert_base", CPU_NETWORK),
    ]
    got = plan(Machine(16), parts, fixed(env))
    assert (got.part("resnet").count, got.part("resnet").threads) == (5, 4)  # model.toml said 2
    assert got.part("yolov5_preprocess").count == 3
    assert got.part("bert_base").threads == 4  # "4" alone: every model
    assert (got.router_workers, got.nginx_workers) == (7, 2)


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [("TRITON_INSTANCES", "resnet=0", "at least 1"), ("TRITON_THREADS", "resnet=two", "not N or NAME=N")],
)
def test_a_bad_count_variable_is_refused_with_its_name(variable, raw, message):
    with pytest.raises(ValueError, match=f"{variable}.*{message}"):
        fixed({variable: raw})


def test_a_spec_refuses_a_misspelt_or_bad_instances_value(tmp_path):
    from app.core.spec import SpecError

    text = (PROJECT_ROOT / "models" / "resnet" / "model.toml").read_text()
    for bad, message in (('count = "auto"\ncopies = 2', "unknown key 'copies'"), ("count = 0", "count = 0")):
        folder = tmp_path / f"m{len(message)}"
        folder.mkdir()
        (folder / "model.toml").write_text(text.replace('count = "auto"', bad))
        with pytest.raises(SpecError, match=message):
            load_spec(folder)


def test_the_gpu_check_takes_each_dali_steps_num_threads_from_the_sizing(monkeypatch, capsys):
    from scripts.gpu_check import cli

    monkeypatch.setattr(cli, "detect", lambda: Machine(16, (H100,)))
    threads = cli.sized_threads([specs()["resnet"], specs()["yolov5"]])
    assert threads == {"resnet": 3, "yolov5": 3}  # the table's 16 vCPUs + 1 H100 row
    assert "Plan for this machine: 16 vCPUs, 1 x NVIDIA H100" in capsys.readouterr().out
