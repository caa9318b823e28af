"""Dead letters as a backend receives them, and the backend's protocol (hook ``lbs_dead_letter_backend``).

The re-queue script writes dead letters to the service's dead-letter stream
atomically with taking them out of circulation; that stream is what makes
"nothing lost" true. A backend (hook ``lbs_dead_letter_backend``) forwards
them further: a JSON-lines file, another Redis, a database. The forwarder
deletes a dead letter from the stream only after the backend's ``write``
returned (confirmed); a write that raises leaves the batch in the stream,
and it is written again later. Delivery to the backend is therefore
at-least-once: a crash between a confirmed write and the delete writes that
batch again, so a backend that must not see duplicates keys on
:attr:`DeadLetter.id`.

Every client with a backend forwards, in the consumer group
``<service>-dlq-forwarders`` on the dead-letter stream (each letter goes to
one forwarder; a forwarder first retries its own unconfirmed letters, and
takes over those another forwarder left unconfirmed for
``Config.dead_letter_claim_idle`` seconds). The forwarding task is
lbs._consumer.forwarder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from . import _keys

__all__ = ["DeadLetter", "DeadLetterBackend"]


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
    def lbs_input(self) -> str:
        """The assignment's ``lbs-input`` JSON, as it was (possibly malformed)."""
        return self.fields.get(_keys.INPUT_FIELD, "")

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "reason", "consumer", "failed_id", "retry_count", "fields"}``: JSON-ready."""
        return {"id": self.id, "reason": self.reason, "consumer": self.consumer, "failed_id": self.failed_id,
                "retry_count": self.retry_count, "fields": dict(self.fields)}


@runtime_checkable
class DeadLetterBackend(Protocol):
    """Where dead letters go after the dead-letter stream (hook ``lbs_dead_letter_backend``)."""

    #: Shown in logs and metric labels.
    name: str

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Write ``letters`` durably; return only once they are. Raise if not written."""
