"""tools/size_check.py: modules up to 600 lines, functions up to 80, an allow-list with reasons
for the few that must be longer, and entries that are no longer needed reported."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("size_check", ROOT / "tools" / "size_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = _tool()


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines."""
    body = "".join(f"{indent}    x = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_limits_are_600_and_80() -> None:
    assert (tool.MAX_MODULE_LINES, tool.MAX_FUNCTION_LINES) == (600, 80)
    for entries in (tool.ALLOWED_MODULES, tool.ALLOWED_FUNCTIONS):
        assert all(isinstance(limit, int) and reason.strip()
                   for limit, reason in entries.values())


def test_modules_and_functions_over_the_limits(tmp_path: Path) -> None:
    ok = tmp_path / "ok.py"
    ok.write_text(_function("f", 80) + "\n" * (600 - 80))
    long = tmp_path / "long.py"
    long.write_text("class C:\n" + _function("m", 81, "    ") + "\n" * 600)
    found = tool.check([tmp_path], allowed_modules={}, allowed_functions={})
    assert [line.replace(str(tmp_path), "T") for line in found] == [
        "T/long.py: module has 682 lines (limit 600)",
        "T/long.py:2: function C.m has 81 lines (limit 80)"]


def test_allow_list_entries_have_their_own_limit_and_go_stale(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text(_function("f", 90) + "\n" * 600)
    key = long.as_posix()
    modules = {key: (700, "one idea")}
    functions = {f"{key}:f": (90, "one table")}
    assert tool.check([tmp_path], allowed_modules=modules, allowed_functions=functions) == []
    long.write_text(_function("f", 91) + "\n" * 700)
    assert [line.replace(str(tmp_path), "T") for line in
            tool.check([tmp_path], allowed_modules=modules, allowed_functions=functions)] == [
        "T/long.py: module has 791 lines (limit 700)",
        "T/long.py:1: function f has 91 lines (limit 90)"]
    long.write_text(_function("f", 10))
    found = tool.check([tmp_path], allowed_modules=modules, allowed_functions=functions)
    assert [line.split(": ", 1)[1] for line in found] == [
        "allow-list entry no longer needed (gone or within the limit): remove it from "
        "tools/size_check.py"] * 2

