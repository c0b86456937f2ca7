"""The documentation (docs/, built by `make docs`) against the code: every error class of
app/core/errors.py is on the API reference page with its status and code, every setting of
app/core/settings.py on the configuration page with its default, and so are the sizing's variables
and model.toml's [instances] keys; the performance page's sizing table is the plan the code makes for
every instance type; every picture a page shows exists; the README is a front page (at most 150
lines) whose links all resolve."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from app.core import errors, machine
from app.core.settings import (
    ENV_FIELDS,
    NGINX_WORKERS,
    PROJECT_ROOT,
    SIZING_VCPUS,
    TRITON_INSTANCES,
    TRITON_THREADS,
    WORKERS,
    Settings,
)
from app.core.spec import AUTO, INSTANCE_KEYS
from app.serve import sizing_plan as plans

DOCS = PROJECT_ROOT / "docs"
API = DOCS / "reference" / "api.md"
CONFIGURATION = DOCS / "configuration.md"
SIZING_PAGE = DOCS / "sizing.md"
# Read by the sizing (clients/sized_configs.py, app/core/machine.py), not by Settings: not in ENV_FIELDS.
SIZING_VARIABLES = (SIZING_VCPUS, NGINX_WORKERS, TRITON_INSTANCES, TRITON_THREADS)
README = PROJECT_ROOT / "README.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def error_classes() -> list[type[errors.ApiError]]:
    """The error classes with a status and code of their own."""
    found = []
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.ApiError) and "code" in vars(value):
            found.append(value)
    return found


def missing_errors(page: str) -> list[str]:
    """The classes whose status and code stand in no table row of ``page``."""
    rows = [line for line in page.splitlines() if line.startswith("|")]
    return [
        f"{cls.__name__} {cls.status} {cls.code}"
        for cls in error_classes()
        if not any(f"`{cls.code}`" in row and str(cls.status) in row.split("|")[1] for row in rows)
    ]


def shown_default(value: object) -> str | None:
    """How a default is written on the page; None for a default the page describes in words
    (one that depends on the machine, or that means unset)."""
    if value in ("", 0, None) or value is dataclasses.MISSING:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def missing_settings(page: str) -> list[str]:
    """The variables with no row on ``page``, or whose row does not give the setting's default."""
    rows = {line.split("`")[1]: line for line in page.splitlines() if line.startswith("| `")}
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    problems = []
    for name, (variable, _) in ENV_FIELDS.items():
        row = rows.get(variable)
        if row is None:
            problems.append(f"{variable}: no row")
            continue
        default = fields[name].default
        shown, cell = shown_default(default), row.split("|")[2]
        if (shown is not None and shown not in cell) or not cell.strip():
            problems.append(f"{variable}: the default cell {cell.strip()!r} does not say {shown!r}")
    return problems


def table_rows(page: str) -> dict[str, str]:
    """The rows of ``page``'s tables whose first cell is code, by that code."""
    return {line.split("`")[1]: line for line in page.splitlines() if line.startswith("| `")}


def missing_sizing(page: str) -> list[str]:
    """The sizing's variables with no row on ``page``, and the [instances] keys with no row whose
    default cell says "auto"."""
    rows = table_rows(page)
    problems = [f"{variable}: no row" for variable in SIZING_VARIABLES if variable not in rows]
    for key in INSTANCE_KEYS:
        row = rows.get(key)
        if row is None or f'"{AUTO}"' not in row.split("|")[2]:
            problems.append(f"[instances] {key}: no row with the default {AUTO!r}")
    return problems


def planned_table() -> str:
    """``serve plan --all --markdown`` for the shipped model.toml files, as the page shows it: the
    target each instance type gets by default, named so that a `models/` that `make models` built
    here (for one target) plans the same."""
    rows = [
        (name, plans.plan_for(instance, PROJECT_ROOT / "models", "tensorrt" if instance.gpu_count else "python"))
        for name, instance in machine.INSTANCE_TYPES.items()
    ]
    return plans.markdown_table(rows)


def test_every_error_class_is_on_the_api_reference():
    assert len(error_classes()) >= 15
    assert missing_errors(API.read_text()) == []


def test_every_setting_is_on_the_configuration_page_with_its_default():
    assert missing_settings(CONFIGURATION.read_text()) == []


def test_the_sizing_variables_and_instances_keys_are_on_the_configuration_page():
    assert missing_sizing(CONFIGURATION.read_text()) == []


def test_the_sizing_page_holds_the_plan_for_every_instance_type(monkeypatch):
    for variable in (WORKERS, *SIZING_VARIABLES):
        monkeypatch.delenv(variable, raising=False)
    table = planned_table()
    assert len(table.splitlines()) == 2 + len(machine.INSTANCE_TYPES)
    assert table in SIZING_PAGE.read_text(), (
        "docs/sizing.md's table is not the plan: paste `python -m app.serve.sizing_plan --all --markdown`"
    )


def test_the_checks_fail_when_a_row_goes():
    api = API.read_text()
    without = "\n".join(line for line in api.splitlines() if "`inference_timeout`" not in line)
    assert missing_errors(without) == ["InferenceTimeout 504 inference_timeout"]
    page = CONFIGURATION.read_text()
    without = "\n".join(line for line in page.splitlines() if "`MODEL_LOAD_TIMEOUT`" not in line)
    assert missing_settings(without) == ["MODEL_LOAD_TIMEOUT: no row"]
    changed = page.replace("| `TRITON_TIMEOUT_S` | 30 |", "| `TRITON_TIMEOUT_S` | 45 |")
    assert missing_settings(changed) == ["TRITON_TIMEOUT_S: the default cell '45' does not say '30'"]
    without = "\n".join(line for line in page.splitlines() if "`TRITON_THREADS`" not in line)
    assert missing_sizing(without) == ["TRITON_THREADS: no row"]
    changed = page.replace('| `preprocess` | `"auto"` |', "| `preprocess` | 1 |")
    assert missing_sizing(changed) == ["[instances] preprocess: no row with the default 'auto'"]


def headings(page: Path) -> set[str]:
    """The anchors MkDocs makes of a page's headings (and GitHub of the README's): GitHub keeps a run
    of hyphens (`--draw` -> `---draw`), Python-Markdown's slugify makes it one."""
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        fenced = fenced != line.startswith("```")
        if not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            plain = re.sub(r"[^\w\s-]", "", title)
            found |= {re.sub(r"\s+", "-", plain), re.sub(r"[-\s]+", "-", plain)}  # GitHub's, Python-Markdown's
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in headings(resolved)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_picture_and_link_of_a_page_exists(page: Path):
    assert broken_links(page) == []


def test_the_readme_is_a_front_page_whose_links_resolve():
    assert len(README.read_text().splitlines()) <= 150
    assert broken_links(README) == []
    linked = {target.partition("#")[0] for target in LINK.findall(README.read_text())}
    pages = {f"docs/{p.relative_to(DOCS)}" for p in DOCS.rglob("*.md")}
    assert pages - linked == set(), "pages the README does not link to"


def test_nothing_cites_the_contract_outside_the_project():
    cited = [
        str(path.relative_to(PROJECT_ROOT))
        for top in ("app", "clients", "scripts", "tests")
        for path in (PROJECT_ROOT / top).rglob("*.py")
        if "CONTRACT" + ".md" in path.read_text()
    ]
    assert cited == []
