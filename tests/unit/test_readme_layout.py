"""The architecture page's Layout section (docs/architecture.md): its tree names folders that exist,
and every folder of code is in it."""

from __future__ import annotations

import re

from app.core.settings import PROJECT_ROOT

BRANCH = re.compile(r"^((?:│   |    )*)(?:├── |└── )(\S+)")


def layout_tree() -> list[str]:
    """The folders of the first tree drawn under "## Layout", as paths from the repository's root."""
    page = PROJECT_ROOT.joinpath("docs", "architecture.md").read_text(encoding="utf-8")
    section = page.split("\n## Layout\n", 1)[1]
    block = section.split("```\n", 2)[1]
    parents: list[str] = []
    paths = []
    for line in block.splitlines():
        found = BRANCH.match(line)
        if not found:
            continue
        depth = len(found.group(1)) // 4
        parents[depth:] = [found.group(2).rstrip("/")]
        paths.append("/".join(parents))
    return paths


def code_folders() -> set[str]:
    """Every folder holding Python code of the project (packages of app/, clients/, scripts/, tests/)."""
    found = set()
    for top in ("app", "clients", "scripts", "tests"):
        for init in (PROJECT_ROOT / top).rglob("__init__.py"):
            folder = init.parent.relative_to(PROJECT_ROOT)
            if len(folder.parts) <= 2:
                found.add(folder.as_posix())
    return found


def test_every_folder_the_tree_names_exists():
    paths = layout_tree()
    assert len(paths) >= 15, paths
    missing = [p for p in paths if not (PROJECT_ROOT / p).is_dir()]
    assert missing == [], f"the Layout of docs/architecture.md names folders that do not exist: {missing}"


def test_every_code_folder_is_in_the_tree():
    listed = set(layout_tree())
    assert code_folders() - listed == set(), "folders of code the Layout of docs/architecture.md does not list"
    assert {"models", "docs", ".ci"} <= listed
