"""tools/private_imports.py: a module never reaches into another module's private names.

Synthetic source trees in ``tmp_path``: each case writes a small ``bubblecast`` package and
checks which lines the tool reports (``make lint`` runs it on the real tree)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("private_imports",
                                                  ROOT / "tools" / "private_imports.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = _tool()

#: The package every case starts from: ``b`` defines privates, ``pkg._impl`` is a private module.
BASE = {
    "bubblecast/__init__.py": "",
    "bubblecast/_version.py": "version = '1'\n",
    "bubblecast/b.py": """
        from collections import namedtuple

        __version__ = "1"
        P = namedtuple("P", "x")


        def _y():
            return 1


        class C:
            def _prepare(self):
                return 2

            _inputs = 3
        """,
    "bubblecast/pkg/__init__.py": "",
    "bubblecast/pkg/_impl.py": "def helper():\n    return 1\n",
}


def found(tmp_path: Path, code: str, where: str = "bubblecast/a.py") -> list[str]:
    """The findings on the tree ``BASE`` plus ``code`` at ``where``: ``line: message``."""
    for name, text in {**BASE, where: code}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    prefix = f"{tmp_path / where}:"
    out = tool.findings([tmp_path / "bubblecast"])
    assert all(line.startswith(prefix) for line in out), out
    return [line[len(prefix):] for line in out]


FLAGGED = [
    ("from bubblecast.b import _y\n",
     ["1: imports private name _y from module bubblecast.b"]),
    ("from bubblecast.b import C, _y as y\n",
     ["1: imports private name _y from module bubblecast.b"]),
    ("def f():\n    from bubblecast.b import _y\n    return _y()\n",
     ["2: imports private name _y from module bubblecast.b"]),
    ("from .b import _y\n", ["1: imports private name _y from module bubblecast.b"]),
    ("import bubblecast.b as m\nm._y()\n",
     ["2: imports private name _y from module bubblecast.b"]),
    ("from bubblecast import b\nx = b._y\n",
     ["2: imports private name _y from module bubblecast.b"]),
    ("from . import b\nx = b._y\n", ["2: imports private name _y from module bubblecast.b"]),
    ("import bubblecast.b\nbubblecast.b._y()\n",
     ["2: imports private name _y from module bubblecast.b"]),
    ("from bubblecast.b import C\nC._prepare(None)\n",
     ["2: uses private name _prepare of bubblecast.b.C"]),
    ("import bubblecast.b as m\nx = m.C._inputs\n",
     ["2: uses private name _inputs of bubblecast.b.C"]),
    ("def f(frame):\n    from bubblecast.b import C\n    return C._prepare(frame)\n",
     ["3: uses private name _prepare of bubblecast.b.C"]),
    ("from bubblecast.b import C\n\n\ndef f():\n    def g():\n        return C._inputs\n"
     "    return g\n", ["6: uses private name _inputs of bubblecast.b.C"]),
    ("from bubblecast.b import C\nc = C()\nc._prepare()\n",
     ["3: uses private name _prepare of a bubblecast.b.C object (c)"]),
    ("def f():\n    from bubblecast.b import C\n    c = C()\n    return c._inputs\n",
     ["4: uses private name _inputs of a bubblecast.b.C object (c)"]),
    ("""
     class D:
         def __init__(self):
             from bubblecast.b import C

             self.client = C()

         def go(self):
             return self.client._prepare()
     """, ["8: uses private name _prepare of a bubblecast.b.C object (self.client)"]),
    ("import bubblecast.b as m\n\n\ndef f(x: m._y = m._y) -> None:\n    pass\n",
     ["4: imports private name _y from module bubblecast.b"]),
    # the instance's factory is resolved where the instance is bound
    ("from bubblecast.b import C\nc = C()\n\n\ndef f():\n    C = 1\n    return c._inputs, C\n",
     ["7: uses private name _inputs of a bubblecast.b.C object (c)"]),
    # parameters annotated with an imported class
    ("from typing import Optional\n\nfrom bubblecast.b import C\n\n\n"
     "def f(a: C, b: C | None, c: 'C', d: Optional[C]):\n"
     "    return a._inputs, b._inputs, c._prepare(), d._inputs\n",
     ["7: uses private name _inputs of a bubblecast.b.C object (a)",
      "7: uses private name _inputs of a bubblecast.b.C object (b)",
      "7: uses private name _inputs of a bubblecast.b.C object (d)",
      "7: uses private name _prepare of a bubblecast.b.C object (c)"]),
    ("from bubblecast.pkg import _impl\n",
     ["1: imports private name _impl from module bubblecast.pkg"]),
    ("import bubblecast.pkg._impl\n", ["1: imports private module bubblecast.pkg._impl"]),
    ("from bubblecast.pkg._impl import helper\n",
     ["1: imports private module bubblecast.pkg._impl"]),
]


@pytest.mark.parametrize(("code", "expected"), FLAGGED)
def test_reach_ins_are_reported(tmp_path: Path, code: str, expected: list[str]) -> None:
    assert found(tmp_path, code) == expected


CLEAN = [
    "from bubblecast import _version\nfrom bubblecast.b import __version__\n",
    "import bubblecast.b as m\nx = (m.__doc__, m.__version__, m.C.__name__, m.C().x)\n",
    # own privates (b imports itself: odd, but its own names)
    "from bubblecast.b import C\n",
    "import os\nfrom collections import namedtuple\nos._exit\nnamedtuple._make\n",
    # a parameter, a local or an attribute that shadows the imported name
    "import bubblecast.b as m\n\n\ndef f(m):\n    return m._y\n",
    "from bubblecast.b import C\n\n\ndef f():\n    C = object()\n    return C._y\n",
    "from bubblecast.b import C\n\n\ndef f(obj):\n    return obj._inputs, obj.C._y\n",
    "from bubblecast.b import C\nC = None\nC._y\n",
    # the namedtuple API and sunder names
    "from bubblecast.b import P\np = P._make([1])\nq = p._replace(x=2)\nP._fields\nP._missing_\n",
    # a subclass calling its base's protected method
    "from bubblecast.b import C\n\n\nclass D(C):\n    def _prepare(self):\n"
    "        return C._prepare(self)\n",
    # an instance whose name is bound twice, and attributes of an instance's attributes
    "from bubblecast.b import C\nc = C()\nc = 3\nc._y\nd = C()\nd.sub._y\n",
    # self.x assigned two ways
    "from bubblecast.b import C\n\n\nclass D:\n    def __init__(self):\n"
    "        self.c = C()\n\n    def reset(self):\n        self.c = None\n\n"
    "    def go(self):\n        return self.c._prepare()\n",
    # a class's own privates; calls' results
    "from bubblecast.b import C\n\n\nclass D:\n    def _z(self):\n        return 1\n\n"
    "    def go(self):\n        return self._z(), D._z(self), C()._inputs\n",
    # parameters of unknown class, or rebound
    "from typing import Any\n\nfrom bubblecast.b import C\n\n\n"
    "def f(a: Any, b: list[C], c: C):\n    c = a\n    return a._y, b._y, c._y\n",
    # a staticmethod's first parameter is not the instance
    "from bubblecast.b import C\n\n\nclass D:\n    @staticmethod\n    def make(x):\n"
    "        x.c = C()\n\n    def go(self):\n        return self.c._prepare()\n",
]


@pytest.mark.parametrize("code", CLEAN)
def test_allowed_names_are_not_reported(tmp_path: Path, code: str) -> None:
    assert found(tmp_path, code) == []


def test_relative_import_from_a_subpackage(tmp_path: Path) -> None:
    assert found(tmp_path, "from ..b import _y\n", "bubblecast/pkg/m.py") == [
        "1: imports private name _y from module bubblecast.b"]


def test_own_privates_and_private_modules_inside_their_package(tmp_path: Path) -> None:
    assert found(tmp_path, "from bubblecast.b import _y\n_y()\n", "bubblecast/b.py") == []
    code = ("from bubblecast.pkg import _impl\nfrom bubblecast.pkg._impl import helper\n"
            "from ._impl import helper as h\nimport bubblecast.pkg._impl as m\n"
            "import bubblecast\n_impl.helper(), m.helper(), bubblecast.pkg._impl.helper()\n")
    assert found(tmp_path, code, "bubblecast/pkg/use.py") == []


def test_main_prints_one_line_per_finding_and_exits_1(tmp_path: Path, capsys) -> None:
    found(tmp_path, "from bubblecast.b import _y, C\nC._prepare(None)\n")
    assert tool.main([str(tmp_path / "bubblecast")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[1] for line in out] == [
        "imports private name _y from module bubblecast.b",
        "uses private name _prepare of bubblecast.b.C"]
    assert out[0].startswith(f"{tmp_path / 'bubblecast' / 'a.py'}:1: ")
    (tmp_path / "bubblecast" / "a.py").write_text("from bubblecast.b import C\n")
    assert tool.main([str(tmp_path / "bubblecast")]) == 0

