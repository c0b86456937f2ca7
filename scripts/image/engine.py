"""The container engine and what it needs on this machine.

docker when its daemon answers; podman otherwise (``make podman`` installs it from Debian's
packages, as ``make nginx`` installs NGINX). Where podman's defaults cannot start a container
(a machine that may not raise its own file limit, or whose cgroups crun cannot drive), a
containers.conf of ours is handed to every podman command through ``CONTAINERS_CONF``: no
default ulimits, cgroupfs, runc. Only then: elsewhere podman keeps its own settings.

The CPU image's base is ``CPU_BASE`` (the public Debian 12 image). Where no registry can be reached
it is made here: ``debootstrap --variant=minbase bookworm`` into ``build/image/rootfs``, imported as
``LOCAL_BASE`` (once; later builds reuse it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.core.settings import PROJECT_ROOT

CPU_BASE = "docker.io/library/debian:bookworm-slim"
LOCAL_BASE = "localhost/debian-bookworm-minbase:latest"
WORK = PROJECT_ROOT / "build" / "image"
# The host's CA bundle (Debian's ca-certificates): mounted into builds for pip, whose downloads may
# pass a TLS proxy only the host trusts. Mounted beside the image's own bundle, never over it.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA_BUNDLE = "/run/host-ca-certificates.crt"
CLIENT_EXIT_S = 10  # a `run` client's exit once its container has stopped (podman removes it first: seconds)
PODMAN_CONF = """# podman settings for machines where its defaults cannot start a container (scripts/image/engine.py)
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


class EngineError(RuntimeError):
    pass


@dataclass
class Engine:
    """A container engine's command and the environment its commands run with."""

    binary: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return Path(self.binary).name

    def argv(self, *args: str) -> list[str]:
        return [self.binary, *args]

    def process_options(self) -> dict:
        """The ``subprocess`` options every engine command runs with: its environment, and its working
        directory, build/image (conmon writes a file named ``oom`` into its working directory when a
        container runs out of memory, which must not land wherever a command was called from: the
        project's root, for ``make image-run`` and the tests)."""
        WORK.mkdir(parents=True, exist_ok=True)
        return {"cwd": WORK, "env": {**os.environ, **self.env}}

    def run(
        self,
        *args: str,
        check: bool = True,
        quiet: bool = False,
        timeout: float | None = None,
        new_session: bool = False,
    ):
        """One engine command; its output shown unless ``quiet`` (then captured and returned);
        ``new_session``: out of reach of the terminal's signals (a second Ctrl-C)."""
        completed = subprocess.run(
            self.argv(*args),
            **self.process_options(),
            text=True,
            capture_output=quiet,
            timeout=timeout,
            start_new_session=new_session,
        )
        if check and completed.returncode != 0:
            detail = (completed.stderr or completed.stdout or "").strip()[-2000:] if quiet else ""
            raise EngineError(f"{self.name} {' '.join(args[:2])} failed ({completed.returncode}) {detail}".strip())
        return completed

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False, quiet=True).returncode == 0


def find_engine(env: Mapping[str, str] | None = None) -> Engine:
    """docker with a daemon, else podman; an EngineError naming the way out when neither."""
    env = os.environ if env is None else env
    docker = shutil.which("docker", path=env.get("PATH"))
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        return Engine(docker)
    podman = shutil.which("podman", path=env.get("PATH"))
    if podman:
        return Engine(podman)
    raise EngineError(
        "no container engine: docker has no daemon here and podman is not installed "
        "(make podman installs it with apt-get, as root)"
    )


def ensure_base(engine: Engine, base: str | None = None) -> str:
    """The CPU image's base: ``base`` when given, else the public one if it can be pulled, else the
    local Debian made with debootstrap (made once)."""
    if base:
        return base
    if engine.has_image(CPU_BASE):
        return CPU_BASE
    pulled = engine.run("pull", CPU_BASE, check=False, quiet=True, timeout=300)
    if pulled.returncode == 0:
        return CPU_BASE
    if engine.has_image(LOCAL_BASE):
        return LOCAL_BASE
    print(
        f"{CPU_BASE} cannot be pulled here ({(pulled.stderr or '').strip().splitlines()[-1:]}); "
        f"making {LOCAL_BASE} with debootstrap",
        flush=True,
    )
    return make_local_base(engine)


def make_local_base(engine: Engine) -> str:
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin")
    if not debootstrap:
        raise EngineError("debootstrap is not installed (make podman installs it with apt-get)")
    rootfs = WORK / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    subprocess.run([debootstrap, "--variant=minbase", "bookworm", str(rootfs)], check=True, stdout=subprocess.DEVNULL)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        engine.argv("import", "-", LOCAL_BASE),
        stdin=tar.stdout,
        **engine.process_options(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    tar.wait()
    shutil.rmtree(rootfs)
    print(f"made {LOCAL_BASE} in {time.monotonic() - began:.0f} s", flush=True)
    return LOCAL_BASE


def settle_podman(engine: Engine, probe_image: str) -> None:
    """Run ``probe_image`` once with podman's defaults; where that fails, use our containers.conf."""
    if engine.name != "podman" or "CONTAINERS_CONF" in os.environ:
        return
    if engine.run(*_probe(probe_image, "--network", "host"), check=False, quiet=True).returncode == 0:
        return
    conf = WORK / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(PODMAN_CONF)
    engine.env["CONTAINERS_CONF"] = str(conf)
    probe = engine.run(*_probe(probe_image, "--network", "host"), check=False, quiet=True)
    if probe.returncode != 0:
        raise EngineError(f"podman cannot start a container here, even with {conf}: {probe.stderr.strip()[-1000:]}")
    print(f"podman's defaults cannot start a container here: using {conf}", flush=True)


def build_args(engine: Engine, flavor: str, base: str | None, tag: str, generation: bool = False) -> list[str]:
    """The build command's arguments (after ``build``); ``generation``: torch and transformers too."""
    args = ["-t", tag, "--build-arg", f"FLAVOR={flavor}"]
    if generation:
        args += ["--build-arg", "GENERATION=true"]
    if base:
        args += ["--build-arg", f"CPU_BASE={base}"]
    if engine.name == "podman":
        args += ["--network", "host"]
        if HOST_CA_BUNDLE.is_file():
            args += ["-v", f"{HOST_CA_BUNDLE}:{BUILD_CA_BUNDLE}:ro", "--build-arg", f"PIP_CERT={BUILD_CA_BUNDLE}"]
    return [*args, str(PROJECT_ROOT)]


def layers(engine: Engine, tag: str) -> list[tuple[int, str]]:
    """The image's layers as (bytes, the step that made them), largest first."""
    shown = engine.run("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", tag, quiet=True)
    found = []
    for line in shown.stdout.splitlines():
        size, _, step = line.partition("\t")
        found.append((parse_size(size), " ".join(step.split())))
    return sorted(found, key=lambda layer: -layer[0])


_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_size(text: str) -> int:
    """``"672 MB"``, ``"8.19kB"``, ``"0B"`` -> bytes (the engines print sizes in decimal units)."""
    text = text.strip().lower().replace(" ", "")
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :] or "b"
    try:
        return int(float(number) * _UNITS[unit])
    except (KeyError, ValueError):
        return 0


def run_args(
    repository: Path | None,
    port: int,
    tag: str,
    *,
    publish: bool = True,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """``run`` as SageMaker runs the image: the port published (or the host's network), the model
    repository read-only at /opt/ml/model, ``serve`` as the command. Triton's python backend keeps
    its tensors in /dev/shm: 1 GiB of it (containers get 64 MiB by default)."""
    args = ["run", "--shm-size", "1g"]
    args += ["-p", f"{port}:8080"] if publish else ["--network", "host", "-e", f"SAGEMAKER_BIND_TO_PORT={port}"]
    if repository is not None:
        args += ["-v", f"{Path(repository).resolve()}:/opt/ml/model:ro"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return [*args, *extra, tag, "serve"]


def stop_container(engine: Engine, name: str, client: subprocess.Popen, grace_s: int = 30) -> None:
    """Stop the container ``client`` (its ``run --rm``, attached) started, as SageMaker stops one:
    SIGTERM, SIGKILL ``grace_s`` later. Then ``rm -f``, so that it is gone even where the client did
    not remove it (a stop that came before the container existed, a client that died), and the client
    ends. Both commands in their own session, as the client is: a second Ctrl-C cannot cut the grace short."""
    engine.run("stop", "-t", str(grace_s), name, check=False, quiet=True, new_session=True)
    with contextlib.suppress(subprocess.TimeoutExpired):
        client.wait(timeout=CLIENT_EXIT_S)  # it removes the container (--rm), then exits
    engine.run("rm", "-f", name, check=False, quiet=True, new_session=True)
    try:
        client.wait(timeout=CLIENT_EXIT_S)
    except subprocess.TimeoutExpired:
        client.kill()
        client.wait()


def can_publish(engine: Engine, image: str) -> bool:
    """Can this engine publish a port here (a bridge network), or must it use the host's?"""
    with socket.socket() as probe:  # a port free now (the probe container exits at once)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return engine.run(*_probe(image, "-p", f"{port}:8080"), check=False, quiet=True).returncode == 0


def _probe(image: str, *options: str) -> list[str]:
    """A container of ``image`` that only starts and exits (whatever its entrypoint)."""
    return ["run", "--rm", *options, "--entrypoint", "true", image]


def show(argv: Sequence[str]) -> None:
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
