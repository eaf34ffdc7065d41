"""Size guide of the house rules: modules up to 600 lines, functions up to 80.

The limits are a guide to keep one idea per module, not a target to split for. A module or a
function that must be longer (one idea that does not divide) goes into :data:`ALLOWED_MODULES`
or :data:`ALLOWED_FUNCTIONS` below, with the reason and the size it may grow to. A limit is never
met by splitting a class's internals across files: pieces that call each other's private names
are one idea (``tools/private_imports.py`` reports such reach-ins).

Lines are physical lines (docstrings and comments count); a function runs from its ``def``
line to its last line, decorators excluded, and methods and nested functions are checked on
their own as well as inside their parent (named by qualified name, ``Class.method``). Prints
one line per offender, and per allow-list entry that is no longer needed (its file or function
is gone or back under the limit), and exits 1 when there is any, 0 otherwise. Run by
``make lint``:

    .venv/bin/python tools/size_check.py [PATH ...]      # default: bubblecast
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: Modules allowed over :data:`MAX_MODULE_LINES`: path from the repository root ->
#: (the lines it may have, why it is one idea that does not divide). None today.
ALLOWED_MODULES: dict[str, tuple[int, str]] = {}

#: Functions allowed over :data:`MAX_FUNCTION_LINES`: ``path:qualified.name`` ->
#: (the lines it may have, why it does not divide). None today.
ALLOWED_FUNCTIONS: dict[str, tuple[int, str]] = {}


def _key(path: Path) -> str:
    """``path`` from the repository root (posix), as the allow-lists name it."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path.as_posix()


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every function and method under ``tree``, nested too."""
    out: list[tuple[str, ast.AST]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                out.append((name, node))
            out += functions(node, f"{name}.")
        else:
            out += functions(node, prefix)
    return out


def offenders(path: Path, max_module: int, max_function: int,
              allowed_modules: dict[str, tuple[int, str]] | None = None,
              allowed_functions: dict[str, tuple[int, str]] | None = None,
              used: set[str] | None = None) -> list[str]:
    """One message per module or function of ``path`` over its limit (an allow-list entry's
    own, where it has one); the allow-list keys that matched are added to ``used``."""
    allowed_modules = ALLOWED_MODULES if allowed_modules is None else allowed_modules
    allowed_functions = ALLOWED_FUNCTIONS if allowed_functions is None else allowed_functions
    used = set() if used is None else used
    text = path.read_text(encoding="utf-8")
    name, key = shown_path(path), _key(path)
    found = []
    lines = len(text.splitlines())
    limit = max_module
    if key in allowed_modules and lines > max_module:
        limit = allowed_modules[key][0]
        used.add(key)
    if lines > limit:
        found.append(f"{name}: module has {lines} lines (limit {limit})")
    for qualname, node in functions(ast.parse(text, filename=str(path))):
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        limit, fkey = max_function, f"{key}:{qualname}"
        if fkey in allowed_functions and size > max_function:
            limit = allowed_functions[fkey][0]
            used.add(fkey)
        if size > limit:
            found.append(f"{name}:{node.lineno}: function {qualname} has {size} lines "
                         f"(limit {limit})")
    return found


def shown_path(path: Path) -> str:
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


def check(paths: list[Path], max_module: int = MAX_MODULE_LINES,
          max_function: int = MAX_FUNCTION_LINES,
          allowed_modules: dict[str, tuple[int, str]] | None = None,
          allowed_functions: dict[str, tuple[int, str]] | None = None) -> list[str]:
    """Every offender under ``paths``, then every allow-list entry of a checked file that
    nothing needed."""
    allowed_modules = ALLOWED_MODULES if allowed_modules is None else allowed_modules
    allowed_functions = ALLOWED_FUNCTIONS if allowed_functions is None else allowed_functions
    files = python_files(paths)
    used: set[str] = set()
    found = [msg for f in files for msg in offenders(f, max_module, max_function,
                                                     allowed_modules, allowed_functions, used)]
    checked = {_key(f) for f in files}
    checked_dirs = [_key(p) for p in paths if p.is_dir()]
    for entry in [*allowed_modules, *allowed_functions]:
        file = entry.split(":")[0]
        covered = file in checked or any(file.startswith(d + "/") for d in checked_dirs)
        if covered and entry not in used:
            found.append(f"{entry}: allow-list entry no longer needed (gone or within the "
                         f"limit): remove it from tools/size_check.py")
    return found


def main(argv: list[str] | None = None) -> int:
    """Check every file; 1 when any module or function is over its limit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[REPO / "bubblecast"])
    parser.add_argument("--max-module", type=int, default=MAX_MODULE_LINES)
    parser.add_argument("--max-function", type=int, default=MAX_FUNCTION_LINES)
    args = parser.parse_args(argv)
    found = check(args.paths, args.max_module, args.max_function)
    for msg in found:
        print(msg)
    if found:
        print(f"size check: {len(found)} over the limits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
