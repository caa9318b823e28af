"""The backends' side: a dead letter as a backend receives it, and the backend's protocol (hook
``lbs_dead_letter_backend``; the forwarding task is :mod:`lbs._consumer.forwarder`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .. import _keys
from .._streamids import id_ms

__all__ = ["DeadLetter", "DeadLetterBackend", "letter_time_ms"]


@dataclass(frozen=True)
class DeadLetter:
    """One entry of the dead-letter stream, as a backend receives it."""

    #: Its id in the dead-letter stream (unique per letter: a key for de-duplication).
    id: str
    #: Every field, decoded as UTF-8 (invalid bytes replaced).
    fields: Mapping[str, str] = field(default_factory=dict)
    #: The managed-field prefix (``Config.field_prefix``).
    prefix: str = "_"

    @property
    def reason(self) -> str:
        return self.fields.get(self.prefix + "reason", "")

    @property
    def consumer(self) -> str:
        return self.fields.get(self.prefix + "consumer", "")

    @property
    def failed_id(self) -> str:
        """The LBS entry that failed."""
        return self.fields.get(self.prefix + "failed_id", "")

    @property
    def retry_count(self) -> int:
        try:
            return int(self.fields.get(self.prefix + "retry_count", "0"))
        except ValueError:
            return 0

    @property
    def traceback(self) -> str:
        """The failure's traceback (its last 8,192 characters), "" when the failure had none (a holder
        that died, a malformed entry)."""
        return self.fields.get(self.prefix + "traceback", "")

    @property
    def key(self) -> str:
        """The key of a keyed message's letter (``run_keyed()``); "" for an assignment's."""
        return self.fields.get(self.prefix + "key", "")

    @property
    def lbs_input(self) -> str:
        """The assignment's ``lbs-input`` JSON, as it was (possibly malformed)."""
        return self.fields.get(_keys.INPUT_FIELD, "")

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "reason", "consumer", "failed_id", "retry_count", "key", "traceback", "fields"}``: JSON-ready."""
        return {
            "id": self.id,
            "reason": self.reason,
            "consumer": self.consumer,
            "failed_id": self.failed_id,
            "retry_count": self.retry_count,
            "key": self.key,
            "traceback": self.traceback,
            "fields": dict(self.fields),
        }


@runtime_checkable
class DeadLetterBackend(Protocol):
    """Where dead letters go after the dead-letter stream (hook ``lbs_dead_letter_backend``)."""

    #: Shown in logs and metric labels.
    name: str

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Write ``letters`` durably; return only once they are. Raise if not written."""


def letter_time_ms(letter_id: str) -> int:
    """When a dead letter was written: its id's milliseconds (the server's clock)."""
    return id_ms(letter_id)
