"""The models a chain's ``model.toml`` names: a family's ``parts`` (``app.core.family``), the keys
whose values are other model folders of the same repository (a ``grounded_segmentation`` chain's
``detector`` and ``segmenter``).

Two things need them besides the chain's own reading: a multi-model archive of the chain carries those
folders (``scripts.sagemaker.package_models``), and a multi-model endpoint links them into Triton's
repository under names of their own (``app.core.model_store``), so the chain's model.toml linked
there names them by those names (``renamed``). Standard library only.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

from app.core.family import Family
from app.core.spec import SPEC_FILE


def named_models(folder: str | Path, families: Mapping[str, Family]) -> dict[str, str]:
    """The models ``<folder>/model.toml`` names by its family's ``parts``, by key; ``{}`` for a model
    that names none, or a file that cannot be read (reading the spec names that problem)."""
    try:
        raw = tomllib.loads((Path(folder) / SPEC_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    family = families.get(str(raw.get("family", "")))
    if family is None:
        return {}
    return {key: raw[key] for key in family.parts if isinstance(raw.get(key), str)}


def renamed(text: str, names: Mapping[str, str], families: Mapping[str, Family]) -> str:
    """A model.toml's text with each model it names (``named_models``) that ``names`` renames written
    by its new name: the line ``key = "name"`` rewritten, the rest of the file as it was. A value not
    written on a line of its own (an inline table, a dotted key) is a ValueError saying so."""
    raw = tomllib.loads(text)
    family = families.get(str(raw.get("family", "")))
    wanted = {
        key: names[raw[key]]
        for key in (family.parts if family else ())
        if isinstance(raw.get(key), str) and raw[key] in names
    }
    for key, name in wanted.items():
        line = re.compile(rf"""^(\s*{re.escape(key)}\s*=\s*)(?:"[^"\\\n]*"|'[^'\n]*')([ \t]*(?:#.*)?)$""", re.MULTILINE)
        text = line.sub(lambda found, name=name: found.group(1) + json.dumps(name) + found.group(2), text, count=1)
    written = tomllib.loads(text)
    wrong = sorted(key for key, name in wanted.items() if written.get(key) != name)
    if wrong:
        raise ValueError(
            f'{SPEC_FILE}: {wrong[0]} must be written as {wrong[0]} = "name" on a line of its own '
            "to be renamed on a multi-model endpoint"
        )
    return text
