"""MkDocs hook: renders the contract as OpenAPI 3 (``app.router.openapi``, built from the model
families as the router builds it for /openapi.json) where a page says ``<!-- openapi -->``: one
section a path and method, its summary, the bodies it takes and its answers. Built with the site, so
the page and the router's own /openapi.json cannot drift apart."""

from __future__ import annotations

import sys
from pathlib import Path

MARKER = "<!-- openapi -->"
ROOT = Path(__file__).resolve().parents[2]


def render(spec: dict) -> str:
    out = [f"*{spec['info']['title']}*, OpenAPI {spec['openapi']}, version {spec['info']['version']}.", ""]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or method.startswith("x-") or method == "parameters":
                continue
            out += [f"### `{method.upper()} {path}`", "", operation.get("summary", ""), ""]
            description = operation.get("description")
            if description:
                out += [description, ""]
            parameters = [p for p in operation.get("parameters", []) if isinstance(p, dict)]
            if parameters:
                out += ["| parameter | in | meaning |", "| --- | --- | --- |"]
                for p in parameters:
                    meaning = " ".join(str(p.get("description", "")).split())
                    out.append(f"| `{p.get('name')}` | {p.get('in')} | {meaning} |")
                out.append("")
            bodies = operation.get("requestBody", {}).get("content", {})
            if bodies:
                out += ["Bodies taken: " + ", ".join(f"`{kind}`" for kind in bodies), ""]
            responses = operation.get("responses", {})
            if responses:
                out += ["| status | answer |", "| --- | --- |"]
                for status, answer in responses.items():
                    out.append(f"| {status} | {' '.join(str(answer.get('description', '')).split())} |")
                out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: object) -> str:
    if MARKER not in markdown:
        return markdown
    if str(ROOT) not in sys.path:  # mkdocs runs from its own bin/: the project's packages from this tree
        sys.path.insert(0, str(ROOT))
    from app.router.openapi import openapi_document
    from clients.families import FAMILIES

    return markdown.replace(MARKER, render(openapi_document(FAMILIES)))
