"""The ``bubblecast`` command line: thin typer commands over the library.

Every command module imports only typer at import time; pandas, torch, mlflow and lightgbm
load inside the command that needs them, so ``bubblecast --help`` stays fast. Errors follow
SPEC §3: exit 2 and one ``bubblecast: error:`` line for bad input, exit 1 for internal faults.
"""

from __future__ import annotations

import os
import sys

import click
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


def _register() -> None:
    import importlib
    import importlib.util

    for name in COMMAND_MODULES:
        module = f"bubblecast.cli.{name}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def _exception_classes() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(Exit, Abort, ClickException) classes of click and of the click that typer vendors."""
    mods = [click.exceptions]
    try:
        from typer._click import exceptions as vendored

        mods.append(vendored)
    except ImportError:
        pass
    exits = tuple({m.Exit for m in mods if hasattr(m, "Exit")} | {typer.Exit})
    aborts = tuple({m.Abort for m in mods if hasattr(m, "Abort")} | {typer.Abort})
    usage = tuple({m.ClickException for m in mods})
    return exits, aborts, usage


def _fail(message: str, code: int) -> int:
    line = " ".join(str(message).split())
    print(f"bubblecast: error: {line}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns (and exits with) the SPEC exit code."""
    _register()
    exits, aborts, usage_errors = _exception_classes()
    try:
        result = app(args=argv, prog_name="bubblecast", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except exits as exc:
        code = exc.exit_code
    except aborts:
        code = _fail("aborted", 130)
    except usage_errors as exc:
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
        sys.exit(code)
    return code
