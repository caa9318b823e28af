"""Every command's ``--help`` runs and names exactly what the command accepts, read from the command itself.

The commands and their parameters come from the typer app (``lbs.cli.app``),
so a new option, or one renamed or removed, is checked here without anyone
updating a list: the help cannot drift from the code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

import lbs
from lbs.__main__ import main
from lbs.cli import app

from _cli_helpers import ROOT, cli_env, flat, run_lbs

pytestmark = pytest.mark.timeout(300)


def _commands() -> list[tuple[list[str], Any]]:
    """``(path, click command)`` for the app and every command and group under it."""
    out: list[tuple[list[str], Any]] = []

    def walk(command: Any, path: list[str]) -> None:
        out.append((path, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()
#: Every option any command takes (a command's help may point at another's).
EVERY_OPTION = {
    opt
    for _, c in COMMANDS
    for p in c.params
    for opt in [*p.opts, *p.secondary_opts]
    if opt.startswith("--")
} | {"--help"}


def test_the_app_has_its_commands() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "demo", "worker", "bench"} <= names
    # status, claim and dlq come from lbs.cli.status and lbs.cli.dlq where those modules exist
    for module, commands in (("status", {"status", "claim"}), ("dlq", {"dlq"})):
        present = (Path(lbs.__file__).parent / "cli" / f"{module}.py").exists()
        assert (commands <= names) == present, (module, names)


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) or "lbs" for p, _ in COMMANDS])
def test_help_names_every_option_the_command_takes(
    tmp_path: Path, path: list[str], command: Any
) -> None:
    proc = run_lbs([*path, "--help"], cli_env(tmp_path / "log"))
    assert proc.returncode == 0, proc.stderr
    out = flat(proc.stdout)
    assert f"Usage: lbs {' '.join(path)}".rstrip() in out
    assert "-h" in out and "--help" in out
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            assert (param.metavar or param.name.upper()) in out, (param.name, out)
        else:
            for opt in [*param.opts, *param.secondary_opts]:
                assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", out), (opt, out)
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out))
    assert mentioned <= EVERY_OPTION, mentioned - EVERY_OPTION
    for name in getattr(command, "commands", {}):
        assert name in out


def test_version(tmp_path: Path) -> None:
    proc = run_lbs(["--version"], cli_env(tmp_path / "log"))
    assert (proc.returncode, proc.stdout) == (0, f"lbs {lbs.__version__}\n")


def test_the_installed_script_is_the_same_app(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "lbs"
    if not script.exists():
        pytest.skip(
            f"no `lbs` script beside {sys.executable} (lbs is not installed in this environment)"
        )
    proc = subprocess.run(
        [str(script), "--version"],
        cwd=ROOT,
        env=cli_env(tmp_path / "log"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (0, f"lbs {lbs.__version__}\n")


def test_a_wrong_command_or_option_is_a_usage_error(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "log")
    proc = run_lbs([], env)
    assert "Usage: lbs" in proc.stdout + proc.stderr  # the help; exit 0 with click < 8.2, 2 after
    proc = run_lbs(["nope"], env)
    assert proc.returncode == 2 and "No such command 'nope'" in flat(proc.stderr)
    proc = run_lbs(["worker", "--no-such-option"], env)
    assert proc.returncode == 2 and "No such option: --no-such-option" in flat(proc.stderr)
    assert "Traceback" not in proc.stderr


def test_main_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"lbs {lbs.__version__}\n"
    assert main(["worker"]) == 2  # MODULE:HANDLER missing


def test_help_shows_what_to_type_not_python_types() -> None:
    """Every ``--help`` names values as man pages do (``--url URL``, a flag takes none, ``SERVICE``),
    never typer's ``<str>``, ``<bool>``, ``<list[str]>``, nor a required argument in braces."""
    from typer.testing import CliRunner

    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    for path, _ in COMMANDS:
        result = runner.invoke(app, [*path, "--help"], prog_name="lbs")
        assert result.exit_code == 0, (path, result.output)
        out = result.output
        typed = re.findall(r"<(?:bool|str|int|float|list\[[^>]*\]|file|path|\w+ range)>", out)
        assert not typed, (path, typed)
        usage = next(line for line in out.splitlines() if "Usage:" in line)
        assert "{" not in usage and "......" not in usage, (path, usage)
    status = flat(runner.invoke(app, ["status", "--help"], prog_name="lbs").output)
    assert "--url URL " in status and "Usage: lbs status [OPTIONS] SERVICE " in status
    assert re.search(r"--json +Print", status), status  # a flag: no value between it and its help
    claim = flat(runner.invoke(app, ["claim", "--help"], prog_name="lbs").output)
    assert "Usage: lbs claim [OPTIONS] SERVICE ENTRY_ID... " in claim
    purge = flat(runner.invoke(app, ["dlq", "purge", "--help"], prog_name="lbs").output)
    assert "Usage: lbs dlq purge [OPTIONS] SERVICE [ID]... " in purge
