"""House rule: no module reaches into another module's private names.

A name that starts with one underscore is private to the module that defines it (and, for a
private module ``_impl.py``, to the package that holds it). This check reads every module of the
given trees with :mod:`ast` and reports, one line per finding and exit 1 when there is any:

- ``from bubblecast.x import _y`` (relative imports too): ``imports private name _y from module
  bubblecast.x``;
- ``m._y`` where ``m`` is bound by an import of a project module (``import bubblecast.x as m``,
  ``from bubblecast import x``, ``import bubblecast.x`` then ``bubblecast.x._y``): the same
  message;
- ``C._y`` where ``C`` is bound by ``from bubblecast.x import C`` (a class, function or other
  object defined in another module), through any chain of public attributes
  (``m.C._y``): ``uses private name _y of bubblecast.x.C``;
- ``c._y`` where the local ``c`` is bound once, by ``c = C(...)`` or as a parameter annotated
  ``c: C`` (``C | None``, ``Optional[C]``, strings too), or ``self.c._y`` where the class's
  methods only ever assign ``self.c = C(...)`` (``C`` as above): ``uses private name _y of a
  bubblecast.x.C object (self.c)``;
- a private module (``bubblecast.pkg._impl``) imported from outside ``bubblecast.pkg``.

Fine: dunder names (``__version__``), sunder names (``_missing_``), ``_version``, the
namedtuple API (``_replace``, ``_asdict``, ``_fields``, ``_field_defaults``, ``_make``), a module's
own privates, a private module imported from inside its own package, and ``Base._y`` inside the
body of a class that derives from ``Base`` (a subclass extending its base). Not seen: objects
of unknown origin (``obj._y`` where ``obj`` is an unannotated or ``Any`` parameter or a call's
result, ``c.sub._y``),
``getattr`` with a string, and ``__dict__``. Names are resolved by scope: a name that a function
(or class, or comprehension) binds otherwise than by import is not the imported one, and a name
a scope binds both by a project import and otherwise is skipped (its meaning depends on the
path taken). Project modules: the top-level packages of the files checked (found by walking up
``__init__.py`` files). Run by ``make lint``:

    .venv/bin/python tools/private_imports.py [PATH ...]      # default: bubblecast
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from size_check import python_files, shown_path  # noqa: E402  (the tools' one file walker)

REPO = Path(__file__).resolve().parents[1]

#: Underscore names that are public by convention.
ALLOWED = frozenset({"_version"})
#: The namedtuple API: public despite the underscore, on objects (never on modules).
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_field_defaults", "_make"})


def is_private(name: str) -> bool:
    """One leading underscore, not a dunder or sunder name, not in :data:`ALLOWED`."""
    if not name.startswith("_") or name in ALLOWED:
        return False
    if name.startswith("__") and name.endswith("__"):
        return False
    return not (len(name) > 2 and name.endswith("_") and not name.startswith("__"))


def module_name(path: Path) -> tuple[str, bool]:
    """Dotted name of the module at ``path`` (walking up the folders holding ``__init__.py``)
    and whether it is a package's ``__init__``."""
    path = path.resolve()
    is_package = path.name == "__init__.py"
    parts = [] if is_package else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), is_package


@dataclass(frozen=True)
class Origin:
    """What a name stands for: the module ``module`` (``attr`` None), the object ``attr`` of
    it (a dotted path below the module), or (``instance``) what calling that object returned,
    e.g. ``c = Client(...)``."""

    module: str
    attr: str | None = None
    instance: bool = False

    def where(self) -> str:
        return self.module if self.attr is None else f"{self.module}.{self.attr}"


@dataclass(frozen=True)
class Call:
    """A local bound once, by ``x = f(...)`` or as a parameter annotated ``x: f`` (``f | None``,
    ``Optional[f]`` and strings too), ``func`` the dotted source of ``f``: resolved where ``x``
    is used (only then are the scopes that resolve ``f`` known)."""

    func: str


#: A scope's names: the project object each stands for, or None (bound otherwise).
Bindings = dict[str, "Origin | Call | None"]

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """Every node evaluated in ``scope`` itself; a nested scope's node is listed (it binds
    its name here) but not what it holds."""
    if isinstance(scope, (*_FUNCTIONS, ast.ClassDef)):
        todo: list[ast.AST] = list(scope.body)
    elif isinstance(scope, ast.Lambda):
        todo = [scope.body]
    elif isinstance(scope, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        todo = [scope.elt, *scope.generators]
    elif isinstance(scope, ast.DictComp):
        todo = [scope.key, scope.value, *scope.generators]
    else:
        todo = list(ast.iter_child_nodes(scope))
    out: list[ast.AST] = []
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _arg_names(node: ast.AST) -> list[str]:
    args = getattr(node, "args", None)
    if not isinstance(args, ast.arguments):
        return []
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg,
                            args.kwarg) if a is not None]


def _self_name(node: ast.AST) -> str | None:
    """The first parameter of a method (``self``, or ``cls`` of a classmethod); None for
    anything else, a staticmethod included."""
    if not isinstance(node, _FUNCTIONS) or not _arg_names(node):
        return None
    if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list):
        return None
    return _arg_names(node)[0]


def _chain(node: ast.AST) -> tuple[str, list[str]] | None:
    """``(root name, attributes)`` of ``a.b.c``; None for anything else."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    return (node.id, attrs) if isinstance(node, ast.Name) else None


def _annotated(node: ast.AST | None) -> tuple[str, list[str]] | None:
    """The class chain of an annotation ``C``, ``m.C``, ``C | None``, ``Optional[C]`` or
    their string forms; None for anything else (generics, unions of classes)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [n for n in (node.left, node.right)
                 if not (isinstance(n, ast.Constant) and n.value is None)]
        return _annotated(sides[0]) if len(sides) == 1 else None
    if isinstance(node, ast.Subscript) and _chain(node.value) in (("Optional", []),
                                                                   ("typing", ["Optional"])):
        return _annotated(node.slice)
    return _chain(node) if isinstance(node, (ast.Name, ast.Attribute)) else None


@dataclass
class Context:
    """Where the walk is: the bindings in force (innermost last, each with whether it is a
    class body's), the base-class names of the class around it, and in a method, the name of
    its first parameter with what the class assigns to that instance's attributes."""

    scopes: list[tuple[Bindings, bool]]
    bases: frozenset[str] = frozenset()
    self_name: str | None = None
    self_attrs: dict[str, Origin | None] | None = None

    def lookup(self, name: str) -> tuple[Origin | Call | None, Context]:
        """What ``name`` stands for, and the context of the scope that binds it (where a
        :class:`Call`'s function is to be resolved)."""
        for i in range(len(self.scopes) - 1, -1, -1):
            if name in self.scopes[i][0]:
                return self.scopes[i][0][name], Context(self.scopes[:i + 1])
        return None, self


class Checker:
    """The findings of one module."""

    def __init__(self, path: Path, shown: str, project: set[str], modules: set[str]) -> None:
        self.shown = shown
        self.project = project
        self.modules = modules
        self.name, is_package = module_name(path)
        self.package = self.name if is_package else self.name.rpartition(".")[0]
        self.found: set[tuple[int, str]] = set()

    # -- names ----------------------------------------------------------------------------
    def _in_project(self, module: str) -> bool:
        return module.split(".")[0] in self.project

    def _absolute(self, node: ast.ImportFrom) -> str | None:
        """The module a ``from ... import`` names, relative imports resolved."""
        if not node.level:
            return node.module
        base = self.package.split(".") if self.package else []
        if node.level - 1 > len(base):
            return None
        base = base[:len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _private_module_ok(self, module: str) -> bool:
        """``module`` has no private part, or this module lies in each private part's package."""
        parts = module.split(".")
        for i, part in enumerate(parts):
            if is_private(part):
                owner = ".".join(parts[:i])
                if not (self.name == owner or self.name.startswith(owner + ".")):
                    return False
        return True

    def _bindings(self, scope: ast.AST) -> Bindings:
        """The names ``scope`` binds: a project import's origin; a local bound exactly once,
        by a call, ``x = f(...)``, where ``f`` is resolved when it is used; None for the
        rest (and for a name bound both by a project import and otherwise)."""
        imported: dict[str, Origin] = {}
        other: dict[str, int] = {}
        calls: dict[str, tuple[str, list[str]] | None] = {}

        def bind(name: str) -> None:
            other[name] = other.get(name, 0) + 1

        for node in _scope_nodes(scope):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if self._in_project(alias.name):
                        imported[bound] = Origin(alias.name if alias.asname else bound)
                    else:
                        bind(bound)
            elif isinstance(node, ast.ImportFrom):
                module = self._absolute(node)
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if module is None or not self._in_project(module) or alias.name == "*":
                        bind(bound)
                    elif f"{module}.{alias.name}" in self.modules:
                        imported[bound] = Origin(f"{module}.{alias.name}")
                    else:
                        imported[bound] = Origin(module, alias.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                bind(node.id)
            elif isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                bind(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for name in node.names:
                    bind(name)
                    bind(name)  # never an instance we can name
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                bind(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bind(node.rest)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
                calls[node.targets[0].id] = _chain(node.value.func)
        args = getattr(scope, "args", None)
        if isinstance(args, ast.arguments):
            for a in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                calls[a.arg] = _annotated(a.annotation)
        for name in _arg_names(scope):
            bind(name)
        out: Bindings = {n: None for n in other}
        for n, origin in imported.items():
            out[n] = origin if n not in other else None
        for n, chain in calls.items():
            if n not in imported and other.get(n) == 1 and chain is not None:
                out[n] = Call(".".join([chain[0], *chain[1]]))
        return out

    def _made_by(self, call: Call, ctx: Context) -> Origin | None:
        """The instance that ``call`` returns, when its function is a project object reached
        by public names from a name bound by an import (else None: a module is not callable,
        and a private step is reported where the call is written)."""
        root, *attrs = call.func.split(".")
        factory, _ = ctx.lookup(root)
        if not isinstance(factory, Origin) or factory.instance:
            return None
        module, obj = factory.module, [] if factory.attr is None else [factory.attr]
        for attr in attrs:
            if is_private(attr):
                return None
            if not obj and f"{module}.{attr}" in self.modules:
                module = f"{module}.{attr}"
            else:
                obj.append(attr)
        return Origin(module, ".".join(obj), instance=True) if obj else None

    # -- checks ---------------------------------------------------------------------------
    def _report(self, line: int, message: str) -> None:
        self.found.add((line, message))

    def _check_import_from(self, node: ast.ImportFrom) -> None:
        module = self._absolute(node)
        if module is None or not self._in_project(module):
            return
        if not self._private_module_ok(module):
            self._report(node.lineno, f"imports private module {module}")
            return
        for alias in node.names:
            if not is_private(alias.name):
                continue
            sub = f"{module}.{alias.name}"
            if (sub in self.modules and not self._private_module_ok(sub)) or \
                    (sub not in self.modules and module != self.name):
                self._report(node.lineno, f"imports private name {alias.name} from module "
                                          f"{module}")

    def _check_import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self._in_project(alias.name) and not self._private_module_ok(alias.name):
                self._report(node.lineno, f"imports private module {alias.name}")

    def _check_attribute(self, node: ast.Attribute, ctx: Context) -> None:
        """Report the first private step of ``node``'s attribute chain when the chain starts
        at a name that stands for a project module, an object imported from one, an instance
        made by calling such an object, or such an instance kept on ``self``."""
        chain = _chain(node)
        if chain is None:
            return
        root, attrs = chain
        found, where = ctx.lookup(root)
        held = root
        if root == ctx.self_name and ctx.self_attrs and len(attrs) >= 2 and \
                ctx.self_attrs.get(attrs[0]) is not None:
            found, held, attrs = ctx.self_attrs[attrs[0]], f"{root}.{attrs[0]}", attrs[1:]
        origin = self._made_by(found, where) if isinstance(found, Call) else found
        if origin is None:
            return
        if origin.instance:  # only its own attributes: what they hold is not known
            attr = attrs[0]
            if is_private(attr) and attr not in NAMEDTUPLE_API and origin.module != self.name:
                self._report(node.lineno, f"uses private name {attr} of a "
                                          f"{origin.where()} object ({held})")
            return
        module, obj = origin.module, [] if origin.attr is None else [origin.attr]
        for attr in attrs:
            if not obj:  # at a module: a submodule or a module attribute
                sub = f"{module}.{attr}"
                if sub in self.modules and self._private_module_ok(sub):
                    module = sub
                elif not is_private(attr):
                    obj = [attr]
                else:
                    if module != self.name:
                        self._report(node.lineno, f"imports private name {attr} from module "
                                                  f"{module}")
                    return
            elif is_private(attr) and attr not in NAMEDTUPLE_API:
                if module == self.name:
                    return  # this module's own object
                if obj == [origin.attr] and root in ctx.bases:
                    return  # Base._name in the body of a subclass of Base
                self._report(node.lineno, f"uses private name {attr} of "
                                          f"{module}.{'.'.join(obj)}")
                return
            else:
                obj.append(attr)

    # -- walk -----------------------------------------------------------------------------
    def run(self, tree: ast.Module) -> list[str]:
        """Check the module; its findings as ``path:line: message`` lines."""
        self._visit(tree, Context([(self._bindings(tree), False)]))
        return [f"{self.shown}:{line}: {msg}" for line, msg in sorted(self.found)]

    def _self_attrs(self, cls: ast.ClassDef, ctx: Context) -> dict[str, Origin | None]:
        """``self.a = f(...)`` in ``cls``'s methods, ``f`` a project object: ``a`` -> that
        instance; None for an attribute assigned otherwise too."""
        out: dict[str, Origin | None] = {}
        for method in cls.body:
            names = _self_name(method)
            if names is None:
                continue
            local = Context([*[s for s in ctx.scopes if not s[1]],
                             (self._bindings(method), False)])
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
                for t in targets:
                    if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                            and t.value.id == names):
                        continue
                    made = None
                    func = _chain(node.value.func) if isinstance(node, ast.Assign) and \
                        len(targets) == 1 and isinstance(node.value, ast.Call) else None
                    if func is not None:
                        made = self._made_by(Call(".".join([func[0], *func[1]])), local)
                    out[t.attr] = None if t.attr in out and out[t.attr] != made else made
        return out

    def _visit(self, node: ast.AST, ctx: Context) -> None:
        """Check ``node`` and what it holds, in context ``ctx``."""
        if isinstance(node, ast.ImportFrom):
            self._check_import_from(node)
        elif isinstance(node, ast.Import):
            self._check_import(node)
        elif isinstance(node, ast.Attribute):
            self._check_attribute(node, ctx)
        if isinstance(node, ast.ClassDef):
            for part in (*node.decorator_list, *node.bases, *node.keywords):
                self._visit(part, ctx)
            inner = Context([*ctx.scopes, (self._bindings(node), True)],
                            frozenset(b.id for b in node.bases if isinstance(b, ast.Name)))
            attrs = self._self_attrs(node, ctx)
            for stmt in node.body:
                me = _self_name(stmt)
                if me is not None:
                    self._visit_function(stmt, inner, me, attrs)
                else:
                    self._visit(stmt, inner)
            return
        if isinstance(node, (*_FUNCTIONS, ast.Lambda)):
            self._visit_function(node, ctx, None, None)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            ctx = Context([*ctx.scopes, (self._bindings(node), False)], ctx.bases,
                          ctx.self_name, ctx.self_attrs)
        for child in ast.iter_child_nodes(node):
            self._visit(child, ctx)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
                        ctx: Context, self_name: str | None,
                        self_attrs: dict[str, Origin | None] | None) -> None:
        """A function: defaults, decorators and annotations in ``ctx``; the body in its own
        scope, which does not see the class bodies around it. ``self_name``/``self_attrs``:
        given for a method; a nested function keeps its method's unless it rebinds the name."""
        args = node.args
        outer: list[ast.AST] = [*args.defaults, *(d for d in args.kw_defaults if d)]
        if not isinstance(node, ast.Lambda):
            outer += node.decorator_list
            outer += [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                             args.vararg, args.kwarg)
                      if a is not None and a.annotation is not None]
            outer += [node.returns] if node.returns is not None else []
        for part in outer:
            self._visit(part, Context(ctx.scopes, ctx.bases))
        bindings = self._bindings(node)
        if self_name is None and ctx.self_name is not None and ctx.self_name not in bindings:
            self_name, self_attrs = ctx.self_name, ctx.self_attrs
        inner = Context([*[s for s in ctx.scopes if not s[1]], (bindings, False)], ctx.bases,
                        self_name, self_attrs)
        for stmt in (node.body if isinstance(node.body, list) else [node.body]):
            self._visit(stmt, inner)


def check_file(path: Path, project: set[str], modules: set[str]) -> list[str]:
    """The findings of one file, as ``path:line: message`` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return Checker(path, shown_path(path), project, modules).run(tree)


def findings(paths: list[Path]) -> list[str]:
    """Every finding in the files under ``paths``."""
    files = python_files(paths)
    names = [module_name(f)[0] for f in files]
    modules = {n for n in names if n}
    project = {n.split(".")[0] for n in modules}
    return [msg for f in files for msg in check_file(f, project, modules)]


def main(argv: list[str] | None = None) -> int:
    """Check every file; 1 when any module reaches into another module's private names."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[REPO / "bubblecast"])
    args = parser.parse_args(argv)
    found = findings(args.paths)
    for msg in found:
        print(msg)
    if found:
        print(f"private imports: {len(found)} reach-ins", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
