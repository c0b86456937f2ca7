"""The sizing applied to Triton's configurations: which part of a served model each ``config.pbtxt``
is (``app.core.sizing``'s kinds), and the same configuration with the plan's counts in it.

Only configurations that model preparation wrote are sized: they carry the ``sizing`` parameter,
which names the values left "auto". The others (a Triton model of the user's own) are served as
they are. The sized text is written beside links to the model's files (``app.core.model_store``),
never into the repository, which may be read-only (``/opt/ml/model``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from app.core import sizing
from app.core.machine import Machine
from app.core.pipeline import SOURCE_PARAMETER, STEP_PARAMETER, TRITON, preprocess_model
from app.core.settings import NGINX_WORKERS, TRITON_INSTANCES, TRITON_THREADS, WORKERS
from app.core.spec import ModelSpec
from clients.families import family_of

log = logging.getLogger("clients.sized_configs")

CONFIG_FILE = "config.pbtxt"
# Where each backend reads its threads: our python-backend network (app/triton/onnx_model.py),
# Triton's onnxruntime backend, the DALI backend.
THREAD_PARAMETERS = {"python": "ort_intra_op_threads", "onnxruntime": "intra_op_thread_count", "dali": "num_threads"}
_PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt"}


@dataclass(frozen=True)
class Config:
    """A parsed configuration, and the part it is (None: not sized)."""

    config: mc.ModelConfig
    part: sizing.Part | None


def _backend(config: mc.ModelConfig) -> str:
    return config.backend or _PLATFORM_BACKENDS.get(config.platform, config.platform)


def _parameter(config: mc.ModelConfig, key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


def part_of(config: mc.ModelConfig, machine: Machine) -> sizing.Part | None:
    """What ``config`` is to the sizing, with the values it was given (None: not ours to size)."""
    if sizing.SIZING_PARAMETER not in config.parameters:
        return None
    auto = set(_parameter(config, sizing.SIZING_PARAMETER).split(","))
    backend = _backend(config)
    if backend == "dali":
        kind = sizing.DALI
    elif backend == "python":
        kind = sizing.PYTHON_STEP if STEP_PARAMETER in config.parameters else sizing.CPU_NETWORK
    elif backend == "onnxruntime":
        kind = sizing.GPU_NETWORK if machine.gpu_count else sizing.CPU_NETWORK
    elif backend == "tensorrt":
        kind = sizing.GPU_NETWORK
    else:
        return None
    count = config.instance_group[0].count if config.instance_group else 1
    threads_key = THREAD_PARAMETERS.get(backend, "")
    given_threads = _parameter(config, threads_key) if threads_key else ""
    threads = 0 if sizing.AUTO_THREADS in auto or not given_threads.strip() else int(given_threads)
    return sizing.Part(
        triton_name=config.name,
        model=_parameter(config, SOURCE_PARAMETER) or config.name,
        kind=kind,
        instances=0 if sizing.AUTO_INSTANCES in auto else count,
        threads=0 if kind in (sizing.PYTHON_STEP, sizing.GPU_NETWORK) else threads,
    )


def read(path: Path, machine: Machine, text: str | None = None) -> Config | None:
    """A ``config.pbtxt`` (or its ``text``); None where it is not one our schema reads (served as it is)."""
    try:
        config = text_format.Parse(path.read_text() if text is None else text, mc.ModelConfig())
    except (OSError, text_format.ParseError) as error:
        log.warning("%s: not sized (%s)", path, error)
        return None
    return Config(config, part_of(config, machine))


def sized_text(config: mc.ModelConfig, sized: sizing.Sized) -> str:
    """``config`` with the plan's instances (a KIND_GPU group counts on each GPU) and threads."""
    config = mc.ModelConfig.FromString(config.SerializeToString())
    kind = mc.ModelInstanceGroup.KIND_GPU if sized.on_gpu else mc.ModelInstanceGroup.KIND_CPU
    del config.instance_group[:]
    config.instance_group.add(count=sized.count, kind=kind)
    key = THREAD_PARAMETERS.get(_backend(config))
    if key and sized.threads:
        config.parameters[key].string_value = str(sized.threads)
    return config_text(config)


def config_text(config: mc.ModelConfig) -> str:
    """``config`` as config.pbtxt's text, ``max_batch_size`` written even where it is 0 (protobuf's text
    leaves a default out, and a configuration silent about it is one Triton completes:
    ``app.serve.tritonserver.left_to_auto_complete``)."""
    text = text_format.MessageToString(config)
    if config.max_batch_size:
        return text
    name, _, rest = text.partition("\n")
    return f"{name}\nmax_batch_size: 0\n{rest}" if name.startswith("name:") else f"max_batch_size: 0\n{text}"


def fixed(env: Mapping[str, str]) -> sizing.Fixed:
    """The counts the environment gives (MODEL_SERVER_WORKERS, NGINX_WORKERS, TRITON_INSTANCES, TRITON_THREADS)."""

    def whole(name: str) -> int:
        raw = env.get(name, "").strip()
        return next(iter(sizing.parse_counts(name, raw).values())) if raw else 0

    return sizing.Fixed(
        router_workers=whole(WORKERS),
        nginx_workers=whole(NGINX_WORKERS),
        instances=sizing.parse_counts(TRITON_INSTANCES, env.get(TRITON_INSTANCES, "")),
        threads=sizing.parse_counts(TRITON_THREADS, env.get(TRITON_THREADS, "")),
    )


def repository_configs(folders: Mapping[str, Path], machine: Machine) -> dict[str, Config | None]:
    """Each Triton model's configuration (by name) among ``folders``."""
    return {name: read(Path(folder) / CONFIG_FILE, machine) for name, folder in folders.items()}


def model_folders(repository: Path) -> dict[str, Path]:
    """The model folders of a repository: those with a config.pbtxt, by name."""
    return {
        entry.name: entry
        for entry in sorted(Path(repository).iterdir())
        if entry.is_dir() and (entry / CONFIG_FILE).is_file() and not entry.name.startswith(".")
    }


def plan_repository(
    repository: Path, machine: Machine, env: Mapping[str, str] | None = None
) -> tuple[sizing.Plan, dict]:
    """The plan for a repository on ``machine``, and its configurations by model name."""
    env = os.environ if env is None else env
    configs = repository_configs(model_folders(repository), machine)
    parts = [config.part for config in configs.values() if config is not None and config.part is not None]
    return plan_models(machine, parts, env), configs


def plan_models(machine: Machine, parts: list[sizing.Part], env: Mapping[str, str]) -> sizing.Plan:
    """``sizing.plan`` with the counts the environment gives."""
    return sizing.plan(machine, parts, fixed(env))


def size_load(
    machine: Machine,
    loaded: Mapping[str, Path],
    new: Mapping[str, Path],
    names: Mapping[str, str],
    env: Mapping[str, str],
) -> tuple[sizing.Plan, dict[str, str]]:
    """A multi-model load's plan: the models ``loaded`` already (their folders in Triton's repository)
    planned together with the ``new`` one's (its folders, to be renamed by ``names``); the sized
    config text of each new Triton model that is sized (by its new name). The loaded models keep
    the counts they were loaded with (Triton would reload them to change), so each load takes the
    share it has among all those loaded."""
    from app.core import pbtxt

    before = [c.part for c in repository_configs(loaded, machine).values() if c is not None and c.part is not None]
    renamed: dict[str, Config] = {}
    for name, folder in new.items():
        text = pbtxt.rename((Path(folder) / CONFIG_FILE).read_text(errors="replace"), dict(names))
        found = read(Path(folder) / CONFIG_FILE, machine, text)
        if found is not None and found.part is not None:
            renamed[names.get(name, name)] = found
    plan = plan_models(machine, [*before, *(c.part for c in renamed.values())], env)
    texts = {name: sized_text(c.config, plan.part(name)) for name, c in renamed.items()}
    return plan, texts


def parts_from_specs(specs: Mapping[str, ModelSpec], target: str, machine: Machine) -> list[sizing.Part]:
    """The parts ``python -m scripts.model_prep --target`` would write for ``specs`` (a plan for a
    repository not prepared yet, or prepared for another machine), with the values model.toml gives."""
    network = {"python": sizing.CPU_NETWORK, "tensorrt": sizing.GPU_NETWORK}.get(
        target, sizing.GPU_NETWORK if machine.gpu_count else sizing.CPU_NETWORK
    )
    parts = []
    for name, spec in specs.items():
        # a family served as a python-backend loop (generate) runs it on every target: it takes CPU
        kind = sizing.CPU_NETWORK if family_of(spec).loop else network
        threads = 0 if kind == sizing.GPU_NETWORK else spec.threads
        # a family that streams batches its requests itself: one instance unless model.toml says more
        instances = spec.instance_count or (1 if family_of(spec).streams else 0)
        parts.append(sizing.Part(name, name, kind, instances, threads))
        if spec.pipeline == TRITON:
            kind = sizing.DALI if target == "tensorrt" else sizing.PYTHON_STEP
            threads = spec.preprocess_threads if kind == sizing.DALI else 0
            parts.append(sizing.Part(preprocess_model(name), name, kind, spec.preprocess_instances, threads))
    return parts
