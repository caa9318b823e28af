"""lbs plugin: forward dead letters to a JSON-lines file.

The example of a dead-letter backend (hook ``lbs_dead_letter_backend``):
each letter becomes one line, ``lbs.DeadLetter.to_dict()`` as JSON. A batch
is appended, flushed and fsynced (in a worker thread) before ``write``
returns, so lbs deletes letters from the dead-letter stream only once they
are on disk. After a crash between the fsync and the delete a batch is
written again: readers that must not see repeats key on the ``id`` field.

Installed, it is inert until told where to write: ``LBS_DLQ_JSONL_PATH``
(``{service}`` in it is replaced by the service's name), or an explicit
``JsonLinesPlugin(path)`` in ``lbs.Client(..., plugins=[...])``. Disable the
installed one with ``lbs.Config(disabled_plugins=("dlq-jsonl",))``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

import lbs

__all__ = ["JsonLinesBackend", "JsonLinesPlugin", "plugin"]


class JsonLinesBackend:
    """Appends dead letters to one file, one JSON object per line, fsynced per batch."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = f"jsonl:{self.path}"

    def _append(self, lines: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    async def write(self, letters: Sequence[lbs.DeadLetter]) -> None:
        lines = "".join(
            json.dumps(letter.to_dict(), ensure_ascii=False) + "\n" for letter in letters
        )
        await asyncio.to_thread(self._append, lines)


class JsonLinesPlugin:
    """Answers ``lbs_dead_letter_backend`` with a :class:`JsonLinesBackend` when it has a path."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else str(path)

    @lbs.hookimpl
    def lbs_dead_letter_backend(self, client: lbs.Client) -> JsonLinesBackend | None:
        path = self.path if self.path is not None else os.environ.get("LBS_DLQ_JSONL_PATH")
        if not path:
            return None  # not configured: dead letters stay in the stream
        return JsonLinesBackend(path.replace("{service}", client.service))


#: The instance the entry point registers.
plugin = JsonLinesPlugin()
