"""Griffe extension for the API reference (mkdocs.yml loads it for mkdocstrings).

What the docstrings need to read well on the site, neither changing them in the source:

* The compiled core's types that ``lbs`` re-exports (``Held``, ``Message``, ``decode_input``,
  ``try_decode_input``) are read from their stub, ``src/_lbscore/_core.pyi``, which has the typed
  signatures (inspecting the extension gives Cython's C-typed ones). Where the stub has no
  docstring, this fills in the one compiled into the extension (from the ``.pyx``), without the
  signature line Cython puts first, so the docs live in one place.
* The docstrings are written with Sphinx roles (``:class:`lbs.Client```), which Markdown does not
  know. A role naming a public ``lbs`` object (not a module: modules are no pages) becomes a cross-reference, which ``mkdocs build
  --strict`` requires to resolve; any other (a relative name, the standard library, a private
  module) becomes plain code. reST's ``::`` before a code block becomes a colon.
* ``.. versionadded:: X`` becomes a line "*New in version X.*"; the ``<lbs.metrics.METRICS>``
  placeholder in ``lbs_metric``'s docstring (filled at import, which static analysis does not
  see) becomes the metrics table.
* Attributes documented the Sphinx way, with ``#:`` comments above them (``Config``'s fields),
  get those comments as their docstrings.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

# reST ends the paragraph before a code block with "::": "text::" reads "text:", a lone "::" goes.
_LONE_LITERAL = re.compile(r"(?m)^[ \t]*::[ \t]*$")
_TRAILING_LITERAL = re.compile(r"(?m)(?<=\S)::[ \t]*$")
_VERSION_ADDED = re.compile(r"(?m)^([ \t]*)\.\. versionadded::[ \t]*(\S+)[ \t]*$")
_METRICS_PLACEHOLDER = re.compile(r"(?m)^[ \t]*<lbs\.metrics\.METRICS>[ \t]*$")
_ROLE = re.compile(r":(?:py:)?(class|meth|func|attr|data|exc|mod|obj):`(~?)([^`<>]+)`")


def _markdown_role(match: re.Match[str]) -> str:
    kind, short, target = match.group(1), match.group(2), match.group(3).strip()
    title = target.rsplit(".", 1)[-1] if short else target
    if (
        kind != "mod"
        and target.startswith("lbs.")
        and not any(part.startswith("_") for part in target.split("."))
    ):
        return f"[`{title}`][{target}]"
    return f"`{title}`"


def _runtime_doc(owner: Any, name: str) -> str | None:
    """The docstring the extension compiled for ``owner.name``, its signature line removed."""
    # A class's own attributes only: an inherited one would bring object's generic texts.
    value = vars(owner).get(name) if inspect.isclass(owner) else getattr(owner, name, None)
    if not (inspect.isclass(value) or inspect.isroutine(value) or inspect.isdatadescriptor(value)):
        return None  # a constant's __doc__ is its type's
    lines = (value.__doc__ or "").strip().splitlines()
    if lines and re.match(rf"{re.escape(name)}\(.*\)", lines[0]):  # Cython's embedded signature
        lines = lines[1:]
    return "\n".join(lines).strip() or None


def _doc_comment(attr: griffe.Object | griffe.Alias) -> str | None:
    """The ``#:`` comment lines right above an attribute (Sphinx's convention, which lbs uses)."""
    if attr.lineno is None or attr.filepath is None or isinstance(attr.filepath, list):
        return None
    lines = attr.lines_collection[attr.filepath]
    found: list[str] = []
    index = attr.lineno - 2  # the line above, 0-based
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        found.insert(0, lines[index].lstrip()[2:].strip())
        index -= 1
    return " ".join(found) or None


class LbsDocstrings(griffe.Extension):
    """Fill the core's stub docstrings from the extension; read ``#:`` comments; turn reST into Markdown."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "_lbscore" and "_core" in pkg.members:
            self._fill(pkg.members["_core"], importlib.import_module("_lbscore._core"))
        if pkg.name in ("lbs", "_lbscore"):
            self._convert(pkg)

    def _fill(self, obj: griffe.Object | griffe.Alias, runtime: Any) -> None:
        for name, member in obj.members.items():
            if member.is_alias or name.startswith("__") or not hasattr(runtime, name):
                continue
            if member.docstring is None:
                doc = _runtime_doc(runtime, name)
                if doc:
                    member.docstring = griffe.Docstring(doc, parent=member)
            if member.is_class:
                self._fill(member, getattr(runtime, name))

    def _convert(self, obj: griffe.Object | griffe.Alias) -> None:
        if obj.docstring is None and obj.is_attribute:
            comment = _doc_comment(obj)
            if comment:
                obj.docstring = griffe.Docstring(comment, parent=obj)
        if obj.docstring is not None:
            text = _TRAILING_LITERAL.sub(":", _LONE_LITERAL.sub("", obj.docstring.value))
            text = _VERSION_ADDED.sub(r"\1*New in version \2.*", text)
            if _METRICS_PLACEHOLDER.search(text):
                from lbs import metrics  # the table is lbs's own, rendered as PLUGINS.md shows it

                table = metrics.render_markdown()
                text = _METRICS_PLACEHOLDER.sub(lambda _: "\n" + table, text)
            obj.docstring.value = _ROLE.sub(_markdown_role, text)
        for member in obj.members.values():
            if not member.is_alias:
                self._convert(member)
