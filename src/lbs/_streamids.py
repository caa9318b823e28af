"""Stream ids (``<milliseconds>-<sequence>``) as the operator's tools take and read them.

One place checks an id a person typed (``lbs claim``, ``lbs dlq``, :class:`lbs.DeadLetters`,
:class:`lbs.ServiceControls`), orders ids, and reads an entry's time from its id (ages in
``lbs status`` and ``lbs dlq``; the server's clock, as Redis wrote it). The compiled core has its
own, for the hot path (``digits.pxi``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

__all__ = ["NOT_AN_ID", "bad_ids", "checked_ids", "id_key", "id_ms", "is_stream_id"]

#: What an id that is not one is told (``<what>: not a stream id (...)``).
NOT_AN_ID = "not a stream id (<milliseconds>-<sequence>)"

_STREAM_ID = re.compile(r"[0-9]+-[0-9]+\Z")


def is_stream_id(value: object) -> bool:
    """Whether ``value`` is a complete stream id, ``<milliseconds>-<sequence>`` (text)."""
    return isinstance(value, str) and _STREAM_ID.match(value) is not None


def bad_ids(values: Iterable[str]) -> list[str]:
    """The values that are not stream ids, in their order."""
    return [v for v in values if not is_stream_id(v)]


def checked_ids(values: Iterable[str], error: Callable[[str], Exception]) -> list[str]:
    """``values`` in their order, each once; ``error(message)`` raised, naming every value that is
    not a stream id, when some is not."""
    ids = list(values)
    bad = bad_ids(ids)
    if bad:
        raise error(f"{NOT_AN_ID}: {', '.join(bad)}")
    return list(dict.fromkeys(ids))


def id_key(entry_id: str | bytes) -> tuple[int, int]:
    """``(milliseconds, sequence)``: ids in the order Redis keeps them (a missing sequence is 0)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def id_ms(entry_id: str) -> int:
    """When the entry was added: its id's milliseconds (the server's clock)."""
    return int(entry_id.partition("-")[0])
