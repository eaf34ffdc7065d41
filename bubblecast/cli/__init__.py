"""The ``bubblecast`` command line: thin typer commands over the library.

Every command module imports only typer at import time; pandas, torch, mlflow and lightgbm
load inside the command that needs them, so ``bubblecast --help`` stays fast. Errors follow
SPEC §3: exit 2 and one ``bubblecast: error:`` line for bad input, exit 1 for internal faults.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from bubblecast._version import __version__
from bubblecast.errors import BubblecastError

app = typer.Typer(
    name="bubblecast",
    help="Predict and remove pipeline bubbles in pipeline-parallel training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bubblecast {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Predict and remove pipeline bubbles in pipeline-parallel training."""


#: Command modules, imported in this order to register their commands with ``app``.
COMMAND_MODULES: tuple[str, ...] = (
    "simulate_cmd", "inspect_cmd", "whatif_cmd", "collect_cmd", "dataset_cmd", "train_cmd",
    "evaluate_cmd", "policy_cmd", "serve_cmd", "run_cmd", "demo_cmd",
)  # fmt: skip
#: The module of each command: running one registers (and typer builds) that command alone.
COMMAND_OF: dict[str, str] = {
    "simulate": "simulate_cmd", "inspect": "inspect_cmd", "whatif": "whatif_cmd",
    "collect": "collect_cmd", "dataset": "dataset_cmd", "train": "train_cmd",
    "evaluate": "evaluate_cmd", "policy-eval": "policy_cmd", "serve": "serve_cmd",
    "run": "run_cmd", "demo": "demo_cmd",
}  # fmt: skip


def _register(command: str | None = None) -> None:
    """Import the command modules (only ``command``'s when it names one), commands kept in
    :data:`COMMAND_MODULES` order whatever was registered before."""
    import importlib
    import importlib.util

    names = (COMMAND_OF[command],) if command in COMMAND_OF else COMMAND_MODULES
    for name in names:
        module = f"bubblecast.cli.{name}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    order = {f"bubblecast.cli.{name}": i for i, name in enumerate(COMMAND_MODULES)}
    app.registered_commands.sort(
        key=lambda info: order.get(getattr(info.callback, "__module__", ""), len(order)))


#: The strings pydantic reads as booleans.
_BOOLS = {**dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
          **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False)}
#: Parameter types converted by :func:`_plain_coercion`, with pydantic's messages.
_PLAIN_ERRORS = {int: "Input should be a valid integer, unable to parse string as an integer",
                 float: "Input should be a valid number, unable to parse string as a number"}


def _plain_param(descriptor: Any, base: type) -> Any:
    """A ``RuntimeParam`` converting ``str``, ``int``, ``float``, ``bool`` and ``Path``
    (or a list of one) the way typer's pydantic adapters do, or None to leave to typer."""
    import typing
    from pathlib import Path

    info = descriptor.parameter_info
    annotation = descriptor.annotation
    item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list and len(
        typing.get_args(annotation)) == 1 else annotation
    plain_path = (not info.exists and info.file_okay and info.dir_okay and not info.writable
                  and not info.resolve_path and not info.allow_dash)
    if (item not in (str, int, float, bool, Path) or descriptor.file_annotation is not None
            or getattr(info, "parser", None) is not None or descriptor.is_choice
            or descriptor.is_ranged or (item is Path and not plain_path)):
        return None

    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, item) and not (item is int and isinstance(value, bool)):
            return value
        try:
            if item is bool:
                return _BOOLS[str(value).strip().lower()]
            if item is int and isinstance(value, str):
                number = float(value)  # pydantic takes "3.0" for 3, not "3.5"
                if number.is_integer() and not value.strip().isdigit():
                    return int(number)
            return item(value)
        except (KeyError, TypeError, ValueError, OverflowError):
            from typer._click.exceptions import BadParameter

            message = _PLAIN_ERRORS.get(item, f"Input should be a valid {item.__name__}")
            raise BadParameter(message, ctx=ctx, param=param) from None

    class Plain(base):  # type: ignore[misc, valid-type]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if item is not annotation:
                return [convert(v, param, ctx) for v in value]
            return convert(value, param, ctx)

    return Plain(parameter_info=info, annotation=annotation)


def _plain_coercion() -> None:
    """typer (0.2x) coerces every parameter through a pydantic ``TypeAdapter`` built when a
    command runs: pydantic's import and an adapter per parameter, ~0.05 s a command. This
    CLI's parameters are plain types, converted here; others (and other typer versions)
    keep typer's own path."""
    try:
        from typer import core
        from typer._coercion import RuntimeParam
    except ImportError:
        return
    original = getattr(core, "build_runtime_param", None)
    if original is None or getattr(original, "bubblecast_plain", False):
        return

    def build_runtime_param(descriptor: Any) -> Any:
        try:
            plain = _plain_param(descriptor, RuntimeParam)
        except AttributeError:  # a typer whose descriptors differ: its own path
            plain = None
        return plain if plain is not None else original(descriptor)

    build_runtime_param.bubblecast_plain = True  # type: ignore[attr-defined]
    core.build_runtime_param = build_runtime_param


def _exception_classes(kind: str) -> tuple[type, ...]:
    """The ``kind`` (``Exit``, ``Abort`` or ``ClickException``) classes of the click that typer
    vendors and of click itself when loaded: typer versions built on click import it (this
    module does not: ~0.01 s of every command). Called in ``except`` clauses, so only when an
    exception is raised, seeing whatever the command loaded."""
    mods = []
    click = sys.modules.get("click")
    if click is not None and hasattr(click, "exceptions"):
        mods.append(click.exceptions)
    try:
        from typer._click import exceptions as vendored

        mods.append(vendored)
    except ImportError:
        pass
    own = {"Exit": {typer.Exit}, "Abort": {typer.Abort}}.get(kind, set())
    return tuple({getattr(m, kind) for m in mods if hasattr(m, kind)} | own)


def _fail(message: str, code: int) -> int:
    line = " ".join(str(message).split())
    print(f"bubblecast: error: {line}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns (and exits with) the SPEC exit code."""
    args = sys.argv[1:] if argv is None else argv
    _register(args[0] if args else None)
    _plain_coercion()
    try:
        result = app(args=argv, prog_name="bubblecast", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except _exception_classes("Exit") as exc:
        code = exc.exit_code
    except _exception_classes("Abort"):
        code = _fail("aborted", 130)
    except _exception_classes("ClickException") as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `bubblecast`: show the help
            print(exc.format_message())
            code = 0
        else:
            code = _fail(exc.format_message(), 2)
    except BubblecastError as exc:
        code = _fail(str(exc), 2)
    except KeyboardInterrupt:
        code = _fail("interrupted", 130)
    except Exception as exc:  # an internal fault: exit 1, traceback only on request
        if os.environ.get("BUBBLECAST_DEBUG"):
            raise
        code = _fail(f"internal error: {type(exc).__name__}: {exc} "
                     "(set BUBBLECAST_DEBUG=1 for the traceback)", 1)
    if argv is None:
        if args and args[0] in QUICK_EXIT and "--cluster" not in args:
            _quick_exit(code)
        sys.exit(code)
    return code


#: Commands that leave nothing for the interpreter to do at exit (no atexit work, no
#: threads, files closed): the console entry skips the interpreter's teardown for them
#: (~0.05 s of freeing pandas' and pyarrow's modules and the events).
QUICK_EXIT: frozenset[str] = frozenset({"inspect", "whatif", "simulate"})


def _quick_exit(code: int) -> None:
    """Flush the output and logging, then end the process without the interpreter's
    teardown (``os._exit``); an output that cannot be flushed leaves the usual exit."""
    import logging

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    logging.shutdown()
    os._exit(code)
