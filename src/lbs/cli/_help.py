"""Readable value names in ``--help``.

Recent typer (0.2x, which carries its own click) shows each parameter's Python type as its value:
``--url <str>``, ``--json <bool>``, ``SERVICE <list[str]>``, and wraps a required argument of the
usage line in braces (``{SERVICE}``, ``{ENTRY_ID...}...``). :func:`readable_values` makes ``--help``
show what to type instead, as man pages do:

* an option's own ``metavar`` when it has one (``--set FIELD=VALUE``); nothing for a flag
  (``--json``, ``--help``); its choices (``text|json``); ``FILE``, ``DIRECTORY`` or ``PATH`` for a
  path; else its name in capitals (``--url URL``, ``--consumer-id CONSUMER_ID``), with ``...``
  when it repeats;
* nothing in the type column of an argument (its name, ``SERVICE``, is beside it);
* the usage line: ``lbs claim [OPTIONS] SERVICE ENTRY_ID...``, ``lbs dlq purge [OPTIONS] SERVICE [ID]...``.

A typer without those hooks (older ones, on click's ``TEXT``/``INTEGER`` metavars) is left as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["readable_values"]


def _option_value(self: Any, ctx: Any) -> str | None:
    """What an option takes, for its ``--help`` row (None: a flag, which takes nothing)."""
    if self.metavar is not None:
        return str(self.metavar)
    if getattr(self, "is_flag", False) or getattr(self, "count", False):
        return None
    desc = getattr(self, "type_descriptor", None)
    if desc is not None and getattr(desc, "is_choice", False):
        shown = str(self.display_type(ctx)).strip("<>")
    elif desc is not None and getattr(desc, "is_path", False):
        shown = str(getattr(desc, "path_type", "path") or "path").upper()
    else:
        shown = (self.name or "value").upper()
    many = self.multiple or self.nargs != 1
    return shown + "..." if many else shown


def _argument_value(self: Any, ctx: Any) -> str | None:
    """Nothing: an argument's name (``SERVICE``, ``ENTRY_ID...``) already says what it takes."""
    return None


def _argument_usage(self: Any) -> str:
    """An argument on the usage line: ``SERVICE``, ``ENTRY_ID...``, ``[ID]...`` (optional)."""
    name = str(self.display_name_raw)
    many = self.nargs != 1 and not name.endswith("...")
    shown = name if self.required else f"[{name}]"
    return shown + "..." if many else shown


def readable_values() -> None:
    """Make typer's ``--help`` show readable value names (see the module's doc); idempotent."""
    try:
        from typer.core import TyperArgument, TyperOption
    except ImportError:  # pragma: no cover - typer without typer.core
        return
    if hasattr(TyperOption, "display_type_rich"):
        TyperOption.display_type_rich = _option_value  # type: ignore[method-assign]
    if hasattr(TyperArgument, "display_type_rich"):
        TyperArgument.display_type_rich = _argument_value  # type: ignore[method-assign]
    if hasattr(TyperArgument, "_usage_display_name"):
        TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
