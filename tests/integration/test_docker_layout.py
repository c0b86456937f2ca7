"""The image's file layout, assembled without Docker, starts as SageMaker starts it and answers /ping.

The Dockerfile's WORKDIR, COPY and ENTRYPOINT lines are read and carried out in a temporary root
(COPY sources relative to the repository root, less what .dockerignore keeps out of the context);
a model repository goes where SageMaker extracts ModelDataUrl (``<root>/opt/ml/model``), and the
entry point runs from the assembled WORKDIR with SageMaker's argument, ``serve``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from app.core.settings import PROJECT_ROOT
from clients.families import find_specs
from scripts.devtools import Stack

pytestmark = pytest.mark.integration

DOCKERFILE = PROJECT_ROOT / "Dockerfile"


@dataclass
class Layout:
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (sources, absolute destination)


def parse_dockerfile(text: str) -> Layout:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    layout = Layout()
    for line in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines():
        keyword, _, args = line.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "WORKDIR":
            layout.workdir = str(PurePosixPath(layout.workdir) / args.strip())
        elif keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            assert not any(w.startswith("--from") for w in shlex.split(args)), "multi-stage COPY: not handled"
            destination = words[-1]
            absolute = destination if destination.startswith("/") else str(PurePosixPath(layout.workdir) / destination)
            layout.copies.append((words[:-1], absolute + ("/" if destination.endswith("/") else "")))
        elif keyword == "ENTRYPOINT":
            layout.entrypoint = json.loads(args)
    return layout


def ignored_by(patterns: list[str], relative: str) -> bool:
    """.dockerignore: the last matching pattern wins; a pattern matching a folder excludes its contents."""
    parts = relative.split("/")
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        if body.startswith("**/"):  # at any depth
            tail = body[3:]
            hit = any(
                fnmatch.fnmatchcase("/".join(parts[j:i]), tail) for i in range(1, len(parts) + 1) for j in range(i)
            )
        else:
            hit = any(fnmatch.fnmatchcase("/".join(parts[:i]), body) for i in range(1, len(parts) + 1))
        if hit:
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    path = PROJECT_ROOT / ".dockerignore"
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def link_or_copy(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)  # the test models are large; a hard link costs nothing
    except OSError:
        shutil.copy2(source, destination)


def copy_tree(source: Path, destination: Path, patterns: list[str]) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file() and not (patterns and ignored_by(patterns, path.relative_to(PROJECT_ROOT).as_posix())):
            link_or_copy(path, destination / path.relative_to(source))


def assemble(layout: Layout, root: Path) -> None:
    patterns = dockerignore_patterns()
    for sources, destination in layout.copies:
        target = root / destination.lstrip("/")
        for source in sources:
            path = PROJECT_ROOT / source
            assert path.exists(), f"COPY {source}: not in the repository"
            assert not ignored_by(patterns, path.relative_to(PROJECT_ROOT).as_posix()), (
                f"COPY {source}: .dockerignore drops it"
            )
            if path.is_dir():
                copy_tree(path, target, patterns)  # COPY of a folder copies its contents
            elif destination.endswith("/") or len(sources) > 1:
                link_or_copy(path, target / path.name)
            else:
                link_or_copy(path, target)


class ImageStack(Stack):
    """`serve` from the assembled image root instead of the repository."""

    def __init__(self, repository: Path, root: Path, layout: Layout):
        super().__init__(repository)
        self.root, self.layout = root, layout

    @property
    def workdir(self) -> Path:
        return self.root / self.layout.workdir.lstrip("/")

    def command(self) -> tuple[list[str], Path, str]:
        # SageMaker extracts ModelDataUrl into /opt/ml/model, where serve looks by default; the real
        # /opt/ml/model is outside this temporary root, so Stack names the same place (MODEL_REPOSITORY).
        # The image's python3 has the serving requirements; here the venv's python plays that part.
        entrypoint = self.root / self.layout.entrypoint[0].lstrip("/")
        argv = [sys.executable, str(entrypoint), *self.layout.entrypoint[1:], "serve"]  # docker run IMAGE serve
        return argv, self.workdir, "image-serve"


def test_dockerfile_parses_into_a_layout():
    layout = parse_dockerfile(DOCKERFILE.read_text())
    assert layout.workdir.startswith("/")
    assert layout.entrypoint and Path(layout.entrypoint[0]).name == "serve"
    copied = {s for sources, _ in layout.copies for s in sources}
    assert {"serve", "nginx.conf", "app/", "clients/", "models/"} <= copied


def test_dockerignore_matching():
    patterns = [".venv", "build", "**/__pycache__", "**/*.pyc"]
    assert ignored_by(patterns, ".venv/bin/python")
    assert ignored_by(patterns, "app/__pycache__/x.cpython-311.pyc")
    assert ignored_by(patterns, "models/resnet/1/__pycache__/model.cpython-311.pyc")
    assert not ignored_by(patterns, "app/serve/supervisor.py")
    assert not ignored_by(patterns, "models/resnet/config.pbtxt")


def test_assembled_image_starts_from_its_workdir_and_pings_200(repository, tmp_path, stopping):
    layout = parse_dockerfile(DOCKERFILE.read_text())
    root = tmp_path / "image"
    assemble(layout, root)
    workdir = root / layout.workdir.lstrip("/")
    assert (workdir / "serve").is_file() and os.access(workdir / "serve", os.X_OK)
    assert not list(root.rglob("__pycache__")), ".dockerignore should keep caches out"

    model_dir = root / "opt" / "ml" / "model"
    copy_tree(repository, model_dir, [])
    stack = ImageStack(model_dir, root, layout).start(tmp_path)
    stopping.append(stack)
    try:
        stack.wait_healthy(timeout=240)
        response = stack.ping()
        assert response.status_code == 200
        assert set(response.json()["models"]) == set(find_specs(model_dir))  # the served models, not their steps
        # Everything runs from the assembled root, not from the repository.
        router = stack.pids()["router"]
        assert router and Path(os.readlink(f"/proc/{router[0]}/cwd")) == workdir
    finally:
        stack.begin_stop()
