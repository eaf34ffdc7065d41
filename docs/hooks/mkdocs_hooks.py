"""MkDocs hooks of the bubblecast site (``hooks:`` in mkdocs.yml; not part of the package).

- The home page is README.md: ``docs/index.md`` is replaced by the README's text, its
  ``docs/PAGE.md`` links rewritten to ``PAGE.md``, so the README and the site's home are one
  text with working links in both.
- The API reference lists every public name of ``bubblecast``: the marker
  ``<!-- api:exports -->`` in ``docs/api.md`` becomes one mkdocstrings ``:::`` block per name
  of ``__all__`` in ``bubblecast/__init__.py``, at the module ``_EXPORTS`` (or a top-level
  ``from ... import``) says it comes from. The file is parsed, not imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bubblecast" / "__init__.py"
README = ROOT / "README.md"
MARKER = "<!-- api:exports -->"


def public_api(init: Path = PACKAGE) -> list[tuple[str, str]]:
    """``(name, "module.attr")`` for every public name in ``__all__`` (dunders aside)."""
    tree = ast.parse(init.read_text())
    names: list[str] = []
    where: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                where[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "_EXPORTS":
                for key, value in ast.literal_eval(node.value).items():
                    where[key] = value.replace(":", ".")
            elif isinstance(target, ast.Name) and target.id == "__all__":
                names = list(ast.literal_eval(node.value))
    missing = [n for n in names if not n.startswith("__") and n not in where]
    if missing:
        raise ValueError(f"bubblecast.__all__ names with no known source: {missing}")
    return [(n, where[n]) for n in names if not n.startswith("__")]


def api_markdown() -> str:
    blocks = []
    for name, path in sorted(public_api(), key=lambda item: item[0].lower()):
        blocks.append(f"::: {path}\n    options:\n      heading: \"{name}\"\n"
                      f"      toc_label: \"{name}\"\n")
    return "\n".join(blocks)


def home_markdown() -> str:
    text = README.read_text()
    return re.sub(r"\]\(docs/", "](", text)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    src = page.file.src_uri
    if src == "index.md":
        return home_markdown()
    if src == "api.md" and MARKER in markdown:
        return markdown.replace(MARKER, api_markdown())
    return markdown
