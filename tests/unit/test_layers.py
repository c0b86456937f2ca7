"""The direction of the dependencies (pyproject.toml's import-linter contracts) holds, and breaks
where it should: a module of the shared layer that imports Flask, or a model client, is refused."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.settings import PROJECT_ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("app", "clients", "scripts")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages under ``root`` (first on the path, before the installed tree)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The project's packages and contracts in a folder of their own, to break on purpose."""
    for package in PACKAGES:
        shutil.copytree(PROJECT_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROJECT_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold_on_the_tree():
    result = lint_imports(PROJECT_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_copy_holds_before_it_is_broken(tree_copy: Path):
    result = lint_imports(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        ("app/core/uses_flask.py", "import flask\n", "Only the router imports the web framework"),
        ("app/core/uses_client.py", "from clients import base\n", "Layers point one way"),
        ("clients/uses_router.py", "from app.router import create_app\n", "Layers point one way"),
        ("app/serve/uses_router.py", "import app.router.wsgi\n", "Layers point one way"),
    ],
)
def test_a_violation_breaks_its_contract(tree_copy: Path, module: str, source: str, broken: str):
    (tree_copy / module).write_text(source)
    result = lint_imports(tree_copy)
    assert result.returncode != 0, result.stdout
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout
    assert module.removesuffix(".py").replace("/", ".") in result.stdout


@pytest.mark.parametrize("module", ["app.core.errors", "app.core.settings", "clients.families", "app.serve.supervisor"])
def test_below_the_router_nothing_loads_flask(module: str):
    """In a fresh interpreter: importing the module does not put flask (or werkzeug) in sys.modules."""
    code = f"import sys, {module}; print(sorted(m for m in ('flask', 'werkzeug') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


SERVING_LAYERS = ("app/router", "app/serve", "app/triton", "app/core", "clients")


def test_a_module_name_says_its_layer_s_role_once():
    """No two modules of the serving layers share a name (the router's text_generation forms are not
    the clients' generation), and none takes a standard library module's name."""
    where: dict[str, list[str]] = {}
    for layer in SERVING_LAYERS:
        for path in sorted((PROJECT_ROOT / layer).rglob("*.py")):
            if path.name != "__init__.py":
                where.setdefault(path.stem, []).append(path.relative_to(PROJECT_ROOT).as_posix())
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
    assert sorted(set(where) & sys.stdlib_module_names) == []


def compares_a_family(node: ast.AST, names: set[str]) -> bool:
    """A comparison (``==``, ``!=``, ``in``, ``not in``) whose one side is a family's name: a string
    of one, a ``*FAMILY_NAME`` constant, or a ``family`` (a variable, or something's ``.family``)
    compared with anything but the table of families."""
    if not isinstance(node, ast.Compare) or not all(
        isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
    ):
        return False
    sides = (node.left, *node.comparators)
    with_the_table = any(isinstance(side, ast.Name) and side.id == "FAMILIES" for side in sides)
    for side in sides:
        if isinstance(side, ast.Constant) and side.value in names:
            return True
        if isinstance(side, ast.Name) and side.id.endswith("FAMILY_NAME"):
            return True
        named = (isinstance(side, ast.Attribute) and side.attr == "family") or (
            isinstance(side, ast.Name) and side.id == "family"
        )
        if named and not with_the_table:
            return True
    return False


def test_outside_a_family_s_module_nothing_compares_family_names():
    """What varies by family is asked of its ``Family`` (``clients.families.FAMILIES``), never by
    comparing its name: a family's own module (the one that builds its ``FAMILY``) alone may. The
    serving code, model preparation (the small models' builders too) and deployment."""
    from clients.families import FAMILIES

    found = []
    for top in ("app", "clients", "scripts/model_prep", "scripts/sagemaker"):
        for path in sorted((PROJECT_ROOT / top).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            if "FAMILY = Family(" in source:
                continue
            found += [
                f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}: {ast.unparse(node)}"
                for node in ast.walk(ast.parse(source))
                if compares_a_family(node, set(FAMILIES))
            ]
    assert found == []


def test_every_family_a_small_model_set_holds_builds_its_small_models_by_its_own_builder():
    from clients.families import FAMILIES
    from scripts.model_prep.small_models.sets import SETS

    families = {family for model_set in SETS.values() for family, _ in model_set.models.values()}
    assert families <= {name for name, family in FAMILIES.items() if family.small}
    assert all(callable(FAMILIES[name].small_builder()) for name in families)
    with pytest.raises(ValueError, match="builds no small models"):
        FAMILIES["detection"].small_builder()
