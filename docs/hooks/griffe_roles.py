"""Griffe extension of the bubblecast site: Sphinx roles in docstrings become inline code.

The package's docstrings cross-reference with Sphinx roles (``:class:`~pkg.mod.Name```,
``:func:`name```, ...), which mkdocstrings would print literally. This turns each into inline
code: the last dotted component when the target starts with ``~``, else the whole target.
Loaded by mkdocstrings (``extensions:`` in mkdocs.yml); not part of the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2).strip()
    if match.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)
