"""The Lua scripts' sources as sent, and what EVALSHA names them by.

A script is ``lua/<name>-<number of keys>.lua`` (``n`` for a variable count); a line
``--#include _<part>`` in it is replaced by ``lua/_<part>.lua`` when it is read. The builders of
the scripts' calls and their result codes are in :mod:`lbs._redis.scripts` (and, for the keyed
API's three, :mod:`lbs._redis.keyed_scripts`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["Script", "load", "source"]


@dataclass(frozen=True)
class Script:
    """One Lua file: its source, SHA1 (what EVALSHA names) and key count (from the file name)."""

    name: str
    source: str
    sha: str
    #: KEYS count, None when it varies (``-n``).
    numkeys: int | None

    @property
    def fixed_keys(self) -> int:
        """The KEYS count of a script whose file name fixes it."""
        if self.numkeys is None:
            raise TypeError(f"{self.name} takes a variable number of keys")
        return self.numkeys


@cache
def source(name: str) -> str:
    """The Lua source of script ``name`` (e.g. ``"read-3"``), as sent: a line ``--#include _<part>`` is
    replaced by ``lua/_<part>.lua`` (code two scripts share, e.g. the fencing counter's)."""
    text = (
        resources.files("lbs")
        .joinpath("_redis")
        .joinpath("lua")
        .joinpath(f"{name}.lua")
        .read_text()
    )
    return _INCLUDE.sub(lambda m: source(m.group(1)).rstrip("\n"), text)


_INCLUDE = re.compile(r"^--#include (_[a-z]+)$", re.MULTILINE)


def load(name: str) -> Script:
    """Script ``name`` (e.g. ``"read-3"``): its source with the includes, SHA1 and key count."""
    text = source(name)
    count = name.rpartition("-")[2]
    return Script(
        name, text, hashlib.sha1(text.encode()).hexdigest(), None if count == "n" else int(count)
    )
