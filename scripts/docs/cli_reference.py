"""Write docs/cli.md, the reference of the ``lbs`` command, from the typer app itself.

Every command, group and sub-command of ``lbs.cli.app``, with its usage, its help text, its
arguments and every option (the option's names, value, default, environment variable and help),
read through typer/click introspection: the page is generated, never edited by hand.

    .venv/bin/python scripts/docs/cli_reference.py           # rewrite docs/cli.md
    .venv/bin/python scripts/docs/cli_reference.py --check   # exit 1 if docs/cli.md is not current

tests/docs/test_cli_reference.py (in ``make test``) fails when docs/cli.md is not what this writes.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"

HEADER = """\
<!-- GENERATED from the typer app (lbs.cli.app) by scripts/docs/cli_reference.py: DO NOT EDIT.
     Regenerate: .venv/bin/python scripts/docs/cli_reference.py -->
# CLI reference

Every command of `lbs` (also `python -m lbs`), with every option, as `lbs COMMAND --help` shows
them. Options that read an environment variable name it; a flag given on the command line wins
over the variable. Exit codes are the same for every command (see
[Operations](operations.md#watching-and-repairing-a-service)): 0 done, 1 a failure, 2 a usage
error, 3 done in part, 78 an invalid setting or URL. `-h` is `--help` everywhere.
"""


def _text(help_text: str | None) -> str:
    """Help text as Markdown: typer's rich escapes (``\\[``) undone, blank-line paragraphs kept,
    and ``<`` outside code spans escaped (``<FIELD>`` would be an HTML tag)."""
    text = (help_text or "").replace("\\[", "[").strip()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(_escape(p) for p in paragraphs if p)


def _escape(text: str) -> str:
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n\n", "<br>").replace("\n", " ")


def _is_option(param: Any) -> bool:
    return bool(param.param_type_name == "option")


def _value(param: Any, ctx: Any) -> str:
    """What an option takes: its metavar, choices or type (typer's ``display_type``); empty for a flag."""
    if _is_option(param) and param.is_flag:
        return ""
    if param.metavar:
        return str(param.metavar)
    shown = str(param.display_type(ctx)).strip("<>")
    if shown.endswith(" range"):
        shown = shown[: -len(" range")]
        if param.min is not None:
            shown += f" >= {param.min}"
    if param.multiple:
        shown = shown.removeprefix("list[").removesuffix("]") + " (repeatable)"
    shown = re.sub(r"\bstr\b", "text", shown)
    if shown == "text":  # as --help names it (lbs.cli._help): what to type, --url URL
        shown = (param.name or "value").upper()
    return shown.upper() if "|" not in shown else shown


def _default(param: Any) -> str:
    """The default ``--help`` shows (an option whose help says its default itself shows none here either)."""
    if not param.show_default:
        return ""
    value = param.default
    if callable(value) or value is None or value == []:
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if _is_option(param) and param.is_flag:
        return "off" if not value else "on"
    return str(value)


def _names(param: Any) -> str:
    names = [*param.opts, *param.secondary_opts]
    return " / ".join(f"`{n}`" for n in names)


def _envvar(param: Any) -> str:
    env = param.envvar
    if not env:
        return ""
    return ", ".join(f"`{e}`" for e in ([env] if isinstance(env, str) else env))


def _usage(path: list[str], command: Any) -> str:
    from typer._click.core import Context

    pieces = command.collect_usage_pieces(Context(command, info_name=path[-1] if path else "lbs"))
    text = " ".join(["lbs", *path, *(re.sub(r"[{}]", "", p) for p in pieces)])
    return text.replace("......", "...")


def _table(rows: list[Any], ctx: Any) -> list[str]:
    out = [
        "| option | value | default | environment | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in rows:
        help_text = _text(getattr(p, "help", None))
        if p.required:
            help_text = f"**Required.** {help_text}" if "Required" not in help_text else help_text
        out.append(
            f"| {_names(p)} | {_cell(_value(p, ctx))} | {_cell(_default(p))} | {_envvar(p)} | {_cell(help_text)} |"
        )
    return out


def _section(path: list[str], command: Any) -> list[str]:
    from typer._click.core import Context

    ctx = Context(command, info_name=path[-1] if path else "lbs")
    title = " ".join(["lbs", *path])
    out = [f"## `{title}`", "", "```text", _usage(path, command), "```", ""]
    help_text = _text(command.help)
    if help_text:
        out += [help_text, ""]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    if arguments:
        out += ["| argument | description |", "| --- | --- |"]
        for p in arguments:
            name = p.metavar or (p.name or "").upper()
            out.append(f"| `{name}` | {_cell(_text(getattr(p, 'help', None)))} |")
        out.append("")
    options = [p for p in command.params if _is_option(p) and not getattr(p, "hidden", False)]
    panels: dict[str, list[Any]] = {}
    for p in options:
        panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(p)
    for panel, rows in panels.items():
        if len(panels) > 1 or panel != "Options":
            out += [f"**{_text(panel)}**", ""]
        out += [*_table(rows, ctx), ""]
    if hasattr(command, "commands") and path:  # the root's commands: the index at the top
        subs = sorted(command.commands.items())
        out += ["| command | what it does |", "| --- | --- |"]
        for name, sub in subs:
            first = _text(sub.help).split("\n\n")[0]
            out.append(f"| [`{title} {name}`](#{_anchor(f'{title} {name}')}) | {_cell(first)} |")
        out.append("")
    return out


def _anchor(title: str) -> str:
    """The id mkdocs' toc gives the heading ``## `title` ``."""
    return re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-")


def render() -> str:
    """docs/cli.md as it should be now."""
    from lbs.cli import app

    root = typer.main.get_command(app)
    lines = [HEADER]
    walked: list[tuple[list[str], Any]] = []

    def walk(command: Any, path: list[str]) -> None:
        walked.append((path, command))
        if hasattr(command, "commands"):
            for name, sub in sorted(command.commands.items()):
                walk(sub, [*path, name])

    walk(root, [])
    lines += ["| command | what it does |", "| --- | --- |"]
    for path, command in walked[1:]:
        title = " ".join(["lbs", *path])
        first = _text(command.help).split("\n\n")[0]
        lines.append(f"| [`{title}`](#{_anchor(title)}) | {_cell(first)} |")
    lines.append("")
    for path, command in walked:
        lines += _section(path, command)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is not current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(
                f"{PAGE.relative_to(ROOT)} is not current: run scripts/docs/cli_reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
