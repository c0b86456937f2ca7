"""How many of each thing run on this machine, decided in one place from what the machine has.

One CPU budget (the machine's vCPUs, ``app.core.machine``) is shared by everything that takes CPU:
the router's gunicorn workers, NGINX's workers, Triton's python steps, the networks that run on the
CPU (instances x ONNX Runtime's intra-op threads) and DALI's threads (copies x ``num_threads`` on
each GPU). Each first gets its floor (one of it; two router workers, so one can die while the other
serves), then the rest of the budget is shared in proportion to the CPU one request costs it
(``CPU_MS``, measured). A network on a GPU takes no CPU budget: it gets ``GPU_NETWORK_INSTANCES``
on every GPU. Where the floors alone take the whole budget (a small machine serving many models),
each takes its floor, except the CPU networks: nothing can be set aside for one, so each is sized
to use up to ``CROWDED_NETWORK_CPUS`` while it runs (the busy model uses the machine; an idle
network takes no CPU), and the plan says it is oversubscribed. A value given in ``model.toml``
``[instances]`` or by an environment variable is taken as it is, and its CPU counted first.

Standard library only: ``serve`` plans at start, a multi-model load plans its model, and
``python -m app.serve.sizing_plan`` prints a plan for any instance type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from app.core.machine import Machine

# What a part of a served model is: how it takes CPU, and which settings size it.
ROUTER, NGINX = "router", "nginx"
CPU_NETWORK, GPU_NETWORK, PYTHON_STEP, DALI = "cpu_network", "gpu_network", "python_step", "dali"

# A config.pbtxt that model preparation wrote carries this parameter: which of its values serve sizes
# ("instances", "threads", comma-separated; empty where model.toml gave them). A config without it
# (a Triton model of the user's own) is served as it is.
SIZING_PARAMETER = "sizing"
AUTO_INSTANCES, AUTO_THREADS = "instances", "threads"


def auto_marker(instances: int, threads: int | None) -> str:
    """The parameter's value for given counts (0: auto; ``threads`` None: the part has no threads)."""
    return ",".join(name for name, value in ((AUTO_INSTANCES, instances), (AUTO_THREADS, threads)) if value == 0)


# ---- the rules ------------------------------------------------------------------------------------
# CPU milliseconds one image request costs each consumer; the budget left after the floors is shared
# in these proportions. Measured on one H100 with 16 vCPUs (make bench, the landed stack) unless said.
CPU_MS: Mapping[str, float] = {
    ROUTER: 4.0,  # gunicorn CPU per resnet JPEG request (bare Flask on the same stack: 1.19)
    NGINX: 0.26,  # NGINX's CPU per request, same run
    PYTHON_STEP: 5.0,  # a python preprocessing step: PIL decode + resize of a 768x576 JPEG, 2.9-5.2 ms (2 cores)
    CPU_NETWORK: 20.0,  # ResNet50 in ONNX Runtime, one image on one core (2 cores)
    # DALI's CPU threads per image: 4 threads gave 2,900 images/s with the H100's JPEG engine
    # (1.4 ms of a thread an image); without it (hw_decoder_load 0, as on A10G and T4) 8 threads 1,401.
    DALI + "_engine": 1.4,
    DALI + "_hybrid": 5.7,
}
ROUTER_MIN_WORKERS = 2  # one worker can die (or be recycled) while the other serves
ROUTER_MAX_WORKERS = 64  # each worker holds its own clients and buffers (~150 MB)
NGINX_MAX_WORKERS = 8  # at 0.26 ms a request one NGINX worker keeps up with ~15 router workers
# ONNX Runtime on the CPU: with instances x threads = 16 on 16 vCPUs, 8 x 2 served bert_base 447 and
# the resnet pipeline 395 requests/s, 4 x 4 412 / 382, 2 x 8 361 / 344, 1 x 16 316 / 307: two
# threads an instance, up to this many instances (each is a process holding the weights). Under four
# CPUs, one thread an instance: on 2 vCPUs all-MiniLM-L6-v2 on 32 texts of 10 tokens costs 1.63 ms of
# CPU a text on one thread, 1.94 on two (the second thread's waits); 2 x 1 serves twice what 1 x 1 does.
CPU_NETWORK_THREADS = 2
CPU_NETWORK_MAX_INSTANCES = 8
# Where the floors take the whole budget, nothing can be set aside for a CPU network, yet a network
# takes CPU only while it runs: each gets up to this many (2 x 2; 2 x 1 on 2 vCPUs), so that the model
# that is busy uses the machine. On 2 vCPUs all-MiniLM-L6-v2 served 2 x 1 beside three other models
# reached 1.14 x SentenceTransformer.encode on requests of 32 short texts, 0.64 x at 1 x 1.
CROWDED_NETWORK_CPUS = 2 * CPU_NETWORK_THREADS
PYTHON_STEP_MAX_INSTANCES = 32
# DALI copies side by side scale almost linearly (H100: 1,750 / 3,348 / 5,194 images/s for 1 / 2 / 3),
# each copy one batch at a time; more threads help most without a JPEG engine (hybrid decoding:
# 4 / 8 / 16 threads 1,045 / 1,770 / 2,900 images/s). The DALI backend's README warns that copies
# cost GPU memory.
DALI_MAX_COPIES = {True: 3, False: 2}  # per GPU, with / without a JPEG engine
DALI_THREADS_PER_COPY = 2  # a copy gets at least this many threads before another copy is added
DALI_MAX_THREADS = 16
# Triton's optimisation guide: two instances of a model on a GPU let one's copies overlap the other's compute.
GPU_NETWORK_INSTANCES = 2


@dataclass(frozen=True)
class Part:
    """One Triton model of a served model, to be sized: its ``kind`` (one of the four above), and
    the values given for it (0: auto)."""

    triton_name: str
    model: str
    kind: str
    instances: int = 0
    threads: int = 0


@dataclass(frozen=True)
class Sized:
    """What a part runs with: ``count`` (instance_group count; per GPU for GPU kinds), ``threads``
    (ONNX Runtime intra-op threads, or DALI's num_threads; 0 for a GPU network), ``cpu`` (the CPU
    threads it takes on the whole machine) and why."""

    triton_name: str
    model: str
    kind: str
    count: int
    threads: int
    cpu: int
    why: str

    @property
    def on_gpu(self) -> bool:
        return self.kind in (GPU_NETWORK, DALI)


@dataclass(frozen=True)
class Plan:
    machine: Machine
    budget: int  # whole CPUs to hand out: the vCPUs, rounded down, at least 1
    router_workers: int
    nginx_workers: int
    parts: tuple[Sized, ...]
    floors: int  # the CPU the floors alone take
    notes: tuple[str, ...] = field(default=())

    @property
    def cpu_threads(self) -> int:
        """The CPU threads handed out: router and NGINX workers, python steps, CPU networks, DALI."""
        return self.router_workers + self.nginx_workers + sum(part.cpu for part in self.parts)

    @property
    def oversubscribed(self) -> bool:
        return self.cpu_threads > self.budget

    def part(self, triton_name: str) -> Sized:
        return next(part for part in self.parts if part.triton_name == triton_name)

    def record(self) -> dict:
        """The plan as one log record's fields."""
        return {
            "machine": {
                "vcpus": self.machine.vcpus,
                "gpus": self.machine.gpu_count,
                "gpu_model": self.machine.gpu_model,
                "jpeg_engine": self.machine.jpeg_engine,
                "memory_gib": round(self.machine.memory_bytes / 1024**3, 1),
                "source": self.machine.source,
            },
            "budget": self.budget,
            "cpu_threads": self.cpu_threads,
            "router_workers": self.router_workers,
            "nginx_workers": self.nginx_workers,
            "models": {
                part.triton_name: {k: v for k, v in asdict(part).items() if k != "triton_name"} for part in self.parts
            },
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Fixed:
    """Values given from outside the plan (environment variables; 0: auto)."""

    router_workers: int = 0
    nginx_workers: int = 0
    instances: Mapping[str, int] = field(default_factory=dict)  # by Triton model name, or "*"
    threads: Mapping[str, int] = field(default_factory=dict)

    def of(self, table: Mapping[str, int], part: Part, given: int) -> int:
        for key in (part.triton_name, part.model, "*"):
            if key in table:
                return table[key]
        return given


def budget_of(machine: Machine) -> int:
    return max(1, math.floor(machine.vcpus + 1e-9))


def _dali_weight(machine: Machine) -> float:
    return CPU_MS[DALI + ("_engine" if machine.jpeg_engine else "_hybrid")]


@dataclass
class _Consumer:
    key: str
    weight: float
    floor: int
    cap: int
    given: int = 0  # the CPU handed out


def _share(consumers: list[_Consumer], budget: int) -> None:
    """Floors first, then the rest in proportion to the weights (largest remainders), within caps."""
    for consumer in consumers:
        consumer.given = consumer.floor
    left = budget - sum(c.floor for c in consumers)
    while left > 0:
        open_ = [c for c in consumers if c.given < c.cap and c.weight > 0]
        if not open_:
            return
        total = sum(c.weight for c in open_)
        wants = {c.key: left * c.weight / total for c in open_}
        handed = 0
        for c in open_:
            extra = min(int(wants[c.key]), c.cap - c.given)
            c.given += extra
            handed += extra
        if handed == 0:  # less than one CPU each: the largest remainders get one
            for c in sorted(open_, key=lambda c: (-(wants[c.key] % 1), c.key))[:left]:
                c.given += 1
                handed += 1
        left -= handed


def _split_network(cpu: int, instances: int, threads: int) -> tuple[int, int]:
    """A CPU network's ``cpu`` as instances x intra-op threads (given values kept)."""
    if instances and threads:
        return instances, threads
    if instances:
        return instances, max(1, cpu // instances)
    if threads:
        return max(1, min(CPU_NETWORK_MAX_INSTANCES, cpu // threads)), threads
    per = CPU_NETWORK_THREADS if cpu >= 2 * CPU_NETWORK_THREADS else 1
    count = max(1, min(CPU_NETWORK_MAX_INSTANCES, cpu // per))
    return count, max(1, cpu // count)


def _split_dali(cpu_per_gpu: int, copies: int, threads: int, engine: bool) -> tuple[int, int]:
    """DALI's CPU on one GPU as copies x num_threads (given values kept)."""
    if copies and threads:
        return copies, threads
    if copies:
        return copies, max(1, min(DALI_MAX_THREADS, cpu_per_gpu // copies))
    if threads:
        return max(1, min(DALI_MAX_COPIES[engine], cpu_per_gpu // threads)), threads
    count = max(1, min(DALI_MAX_COPIES[engine], cpu_per_gpu // DALI_THREADS_PER_COPY))
    return count, max(1, min(DALI_MAX_THREADS, cpu_per_gpu // count))


def _given_cpu(part: Part, machine: Machine) -> int:
    """The CPU a part takes when both its values are given."""
    if part.kind == CPU_NETWORK:
        return part.instances * part.threads
    if part.kind == DALI:
        return part.instances * part.threads * machine.gpu_count
    return part.instances if part.kind == PYTHON_STEP else 0


def _used(sized: Sequence[Sized]) -> int:
    return sum(part.cpu for part in sized)


def plan(machine: Machine, parts: Sequence[Part], fixed: Fixed = Fixed()) -> Plan:
    """The plan for ``parts`` on ``machine``; ``fixed`` (and each part's own given values) win."""
    parts = [
        Part(
            p.triton_name,
            p.model,
            p.kind,
            fixed.of(fixed.instances, p, p.instances),
            fixed.of(fixed.threads, p, p.threads),
        )
        for p in parts
    ]
    if machine.gpu_count == 0 and any(p.kind in (GPU_NETWORK, DALI) for p in parts):
        names = ", ".join(p.triton_name for p in parts if p.kind in (GPU_NETWORK, DALI))
        raise ValueError(f"{names} need a GPU, and {machine.describe()} has none")
    budget, gpus = budget_of(machine), max(1, machine.gpu_count)
    consumers: list[_Consumer] = []
    if fixed.router_workers == 0:
        consumers.append(_Consumer(ROUTER, CPU_MS[ROUTER], ROUTER_MIN_WORKERS, ROUTER_MAX_WORKERS))
    if fixed.nginx_workers == 0:
        consumers.append(_Consumer(NGINX, CPU_MS[NGINX], 1, NGINX_MAX_WORKERS))
    held = fixed.router_workers + fixed.nginx_workers
    networks: set[str] = set()  # the CPU networks the plan sizes
    for part in parts:
        complete = part.kind == GPU_NETWORK or (part.instances and (part.threads or part.kind == PYTHON_STEP))
        if complete:
            held += _given_cpu(part, machine)
        elif part.kind == PYTHON_STEP:
            consumers.append(_Consumer(part.triton_name, CPU_MS[PYTHON_STEP], 1, PYTHON_STEP_MAX_INSTANCES))
        elif part.kind == CPU_NETWORK:
            networks.add(part.triton_name)
            cap = (part.instances or CPU_NETWORK_MAX_INSTANCES) * (part.threads or budget)
            floor = max(part.instances, part.threads, 1) if (part.instances or part.threads) else 1
            consumers.append(_Consumer(part.triton_name, CPU_MS[CPU_NETWORK], floor, cap))
        else:  # DALI: CPU on every GPU
            per_gpu_floor = max(part.instances, part.threads, 1)
            cap = DALI_MAX_COPIES[machine.jpeg_engine] * DALI_MAX_THREADS * gpus
            consumers.append(_Consumer(part.triton_name, _dali_weight(machine), per_gpu_floor * gpus, cap))
    floors = held + sum(c.floor for c in consumers)
    _share(consumers, max(0, budget - held))
    given = {c.key: c.given for c in consumers}
    crowded = floors >= budget
    if crowded:  # nothing is left to set aside: each auto CPU network may use more while it runs
        for c in consumers:
            if c.key in networks:
                given[c.key] = max(c.given, min(budget, CROWDED_NETWORK_CPUS, c.cap))
    sized = []
    for part in parts:
        cpu = given.get(part.triton_name)
        why = "given" if cpu is None else f"{cpu} of the {budget} CPUs"
        if part.kind == GPU_NETWORK:
            count = part.instances or GPU_NETWORK_INSTANCES
            sized.append(Sized(part.triton_name, part.model, part.kind, count, 0, 0, f"{count} on each GPU"))
        elif part.kind == PYTHON_STEP:
            count = part.instances or cpu or 1
            sized.append(Sized(part.triton_name, part.model, part.kind, count, 0, count, why))
        elif part.kind == CPU_NETWORK:
            count, threads = _split_network(cpu or 0, part.instances, part.threads)
            sized.append(Sized(part.triton_name, part.model, part.kind, count, threads, count * threads, why))
        else:
            per_gpu = (cpu or 0) // gpus
            count, threads = _split_dali(per_gpu, part.instances, part.threads, machine.jpeg_engine)
            engine = "with" if machine.jpeg_engine else "without"
            why = f"{why}; {count} copies x {threads} threads on each GPU ({engine} a JPEG engine)"
            sized.append(Sized(part.triton_name, part.model, part.kind, count, threads, count * threads * gpus, why))
    router = fixed.router_workers or given.get(ROUTER, ROUTER_MIN_WORKERS)
    nginx = fixed.nginx_workers or given.get(NGINX, 1)
    if not fixed.router_workers:  # what the splits left unused (whole instances, whole copies) serves requests
        router = min(ROUTER_MAX_WORKERS, router + max(0, budget - router - nginx - _used(sized)))
    result = Plan(
        machine=machine,
        budget=budget,
        router_workers=router,
        nginx_workers=nginx,
        parts=tuple(sized),
        floors=floors,
    )
    notes = []
    if result.oversubscribed:
        notes.append(
            f"oversubscribed: {result.cpu_threads} CPU threads on {budget} CPUs "
            f"({'the floors alone take ' + str(floors) if crowded else 'given values'})"
        )
    if crowded and networks:
        notes.append(
            f"each CPU network sized to use up to {min(budget, CROWDED_NETWORK_CPUS)} of the {budget} CPUs: "
            "the floors take them all, so nothing can be set aside for one, and a network takes CPU only while it runs"
        )
    return replace(result, notes=tuple(notes))


def parse_counts(variable: str, raw: str) -> dict[str, int]:
    """``N`` or ``NAME=N`` entries, comma-separated (``N`` alone: every model) -> {NAME or "*": N}."""
    counts = {}
    for entry in filter(None, (item.strip() for item in raw.split(","))):
        name, _, number = entry.rpartition("=")
        try:
            value = int(number)
        except ValueError:
            raise ValueError(f"{variable}: {entry!r} is not N or NAME=N") from None
        if value < 1:
            raise ValueError(f"{variable}: {entry!r}: the count must be at least 1")
        counts[name.strip() or "*"] = value
    return counts
