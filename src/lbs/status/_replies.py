"""Reading the status's replies: text, counters, reply maps, errors."""

from __future__ import annotations

from typing import Any

from .._redis.wire import text
from ..exceptions import RedisOperationError


def s(value: Any) -> str:
    """A reply value as text (bytes decoded as UTF-8, invalid bytes replaced); None as ""."""
    return "" if value is None else text(value, "replace")


def counter(value: str) -> int:
    """A counter of a key's state ("" or garbage: 0)."""
    return int(value) if value.isdigit() else 0


def keyed(d: Any) -> dict[str, Any]:
    """A reply map with text keys (RESP2 and RESP3 replies, decoded or not)."""
    return {s(k): v for k, v in dict(d).items()}


def check(what: str, reply: Any) -> Any:
    """A reply that must not be an error (the key types were checked first)."""
    if isinstance(reply, Exception):
        raise RedisOperationError(f"status ({what})", reply)
    return reply
