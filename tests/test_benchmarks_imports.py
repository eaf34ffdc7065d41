"""tests/ and benchmarks/ depend one way: tests import the shared helpers in benchmarks/ (the
load generator, the reference oracles, the A/B statistics); benchmarks never import tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (inside functions too)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_benchmarks_never_import_tests() -> None:
    files = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert files
    bad = [f"{f.relative_to(ROOT)}: {name}" for f in files for name in imported_modules(f)
           if name == "tests" or name.startswith("tests.")]
    assert bad == []
