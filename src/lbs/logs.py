"""Structured logs: one JSON object per line, with what each record is about as fields.

lbs logs through the standard :mod:`logging` module (loggers ``lbs.*``). A
client's records carry its service and consumer id, and a record about one
assignment carries the data stream (or, keyed, the key), its entry id, fencing
token and retry count as record attributes. :class:`JsonFormatter` writes them
as fields; the text format keeps them in the message as before::

    import logging, lbs.logs

    handler = logging.StreamHandler()
    handler.setFormatter(lbs.logs.JsonFormatter())
    logging.getLogger().addHandler(handler)

or, for a program that has no logging set up yet, ``lbs.logs.configure(fmt="json")``.
``lbs worker --log-format json`` does the same (and logs its start banner as a record).

A line::

    {"time": "2026-11-25T10:01:02.345Z", "level": "WARNING", "logger": "lbs.client",
     "message": "handler failed on s-7 (entry 1764064862344-0): handler raised ValueError: bad; handing it back",
     "service": "orders", "consumer": "redis-consumer-w1", "stream": "s-7",
     "entry_id": "1764064862344-0", "token": 1795590772764793, "retry_count": 0, "pid": 4242,
     "error": "ValueError: bad", "traceback": "Traceback (most recent call last): ..."}
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any, Literal

__all__ = ["FIELDS", "JsonFormatter", "about", "configure"]

#: The record attributes written as fields when a record has them (lbs sets them through ``extra``);
#: ``who`` and ``action``: the dashboard's action log (``lbs.dashboard``).
FIELDS = (
    "service",
    "consumer",
    "stream",
    "key",
    "entry_id",
    "token",
    "retry_count",
    "banner",
    "who",
    "action",
)


def about(held: Any, *, keyed: bool = False) -> dict[str, Any]:
    """The ``extra`` of a record about one held assignment (an ``lbs`` ``Held``; ``keyed``: a held key,
    whose data stream is the key)."""
    return {
        "key" if keyed else "stream": held.stream,
        "entry_id": held.entry_id,
        "token": held.token,
        "retry_count": held.retry_count,
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (UTC, ms), level, logger, message, pid, the
    lbs fields the record has (:data:`FIELDS`), and for a record with an exception its ``error``
    (``Type: message``) and whole ``traceback``. A value JSON cannot hold is written as its ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        consumer = getattr(record, "consumer_id", None)
        prefix = f"[{consumer}] "
        if consumer is not None and message.startswith(prefix):
            message = message[len(prefix) :]  # the text format's prefix: a field here
        t = time.gmtime(record.created)
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        if consumer is not None:
            out["consumer"] = consumer
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        out["pid"] = record.process
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["traceback"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(
    level: int | str = "INFO", fmt: Literal["text", "json"] = "json", stream: IO[str] | None = None
) -> logging.Handler:
    """Send every record from ``level`` up to ``stream`` (stderr) in ``fmt``: the root logger's
    handlers are replaced by one. Returns the handler."""
    if fmt not in ("text", "json"):
        from .exceptions import ConfigurationError

        raise ConfigurationError(f"log format must be 'text' or 'json', got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
