"""Size limits of the house rules: no module over 400 lines, no function over 80.

Lines are physical lines (docstrings and comments count); a function runs from its ``def``
line to its last line, decorators excluded, and methods and nested functions are checked on
their own as well as inside their parent. Prints one line per offender and exits 1 when there
is any, 0 otherwise. Run by ``make lint``:

    .venv/bin/python tools/size_check.py [PATH ...]      # default: bubblecast
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def offenders(path: Path, max_module: int, max_function: int) -> list[str]:
    """One message per module or function of ``path`` over its limit."""
    text = path.read_text(encoding="utf-8")
    name = _shown(path)
    found = []
    lines = len(text.splitlines())
    if lines > max_module:
        found.append(f"{name}: module has {lines} lines (limit {max_module})")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > max_function:
                found.append(f"{name}:{node.lineno}: function {node.name} has {size} lines "
                             f"(limit {max_function})")
    return found


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, as ruff prints it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def python_files(paths: list[Path]) -> list[Path]:
    """The ``.py`` files named or under the folders named, sorted."""
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return files


def main(argv: list[str] | None = None) -> int:
    """Check every file; 1 when any module or function is over its limit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[REPO / "bubblecast"])
    parser.add_argument("--max-module", type=int, default=MAX_MODULE_LINES)
    parser.add_argument("--max-function", type=int, default=MAX_FUNCTION_LINES)
    args = parser.parse_args(argv)
    found = [msg for f in python_files(args.paths)
             for msg in offenders(f, args.max_module, args.max_function)]
    for msg in found:
        print(msg)
    if found:
        print(f"size check: {len(found)} over the limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
