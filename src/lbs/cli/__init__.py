"""The ``lbs`` command (``python -m lbs``): a typer app.

Commands: ``demo`` (:mod:`lbs.cli.demo`), ``worker`` (:mod:`lbs.cli.worker`,
its supervisor in :mod:`lbs.cli.supervisor`), ``bench`` (:mod:`lbs.cli.bench`),
``services`` (:mod:`lbs.cli.services`), ``register`` (:mod:`lbs.cli.register`),
and, where their modules are present, ``status`` and ``claim``
(:mod:`lbs.cli.status`), the ``dlq`` group (:mod:`lbs.cli.dlq`) and ``dashboard``
(:mod:`lbs.cli.dashboard`, the web dashboard of the ``[dashboard]`` extra).

Exit codes, for every command: 0 success (for a worker: a clean stop, a
signal's drain included); 1 a failure at run time; 2 a usage error; 78 an
invalid setting (``worker``; sysexits' EX_CONFIG).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Annotated

import typer

from .. import __version__
from . import control
from ._help import readable_values
from .bench import bench
from .demo import demo
from .register import register
from .services import services
from .worker import worker

__all__ = ["app", "main"]

# `--url URL`, `--json`, `SERVICE`: not typer's `<str>`, `<bool>`, `<list[str]>` (lbs.cli._help).
readable_values()

app = typer.Typer(
    name="lbs",
    help="lbs: spread work over Redis Streams with exclusive per-stream locks.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    # An unexpected error (a bug) shows a plain traceback, never local variables (URLs carry passwords).
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"lbs {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print lbs's version and exit."
        ),
    ] = False,
) -> None:
    """lbs: spread work over Redis Streams with exclusive per-stream locks."""


app.command("demo")(demo)
app.command("worker")(worker)
app.command("bench")(bench)
app.command("services")(services)
app.command("register")(register)
app.command("pause")(control.pause)
app.command("resume")(control.resume)
app.command("release")(control.release)
app.command("cancel")(control.cancel)


def _optional(name: str) -> ModuleType | None:
    """``lbs.cli.<name>`` if that module exists (another change adds it), else None; its own import errors raise."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        return None


_status = _optional("status")
if _status is not None:
    app.command("status")(_status.status)
    app.command("claim")(_status.claim)
_dlq = _optional("dlq")
if _dlq is not None:
    app.add_typer(_dlq.app, name="dlq")
# The command is always there; without the [dashboard] extra it says how to install it.
_dashboard = _optional("dashboard")
if _dashboard is not None:
    app.command("dashboard")(_dashboard.dashboard)


def main(argv: list[str] | None = None) -> int:
    """Run the ``lbs`` command with ``argv`` (default: ``sys.argv[1:]``); its exit code."""
    try:
        app(args=argv, prog_name="lbs")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        typer.echo(str(code), err=True)
        return 1
    return 0
