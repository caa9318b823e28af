"""A handler module whose import raises (``lbs worker`` shows the traceback of this file and exits 1)."""

from __future__ import annotations


def _fail() -> None:
    raise RuntimeError("boom at import")


_fail()


async def handle(note: object) -> None:  # never reached
    pass
