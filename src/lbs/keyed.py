"""What a keyed handler receives: one held key and a batch of its messages, in order.

See :meth:`lbs.Client.run_keyed` (the consumer) and :class:`lbs.Publisher`
(the producer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from _lbscore import Message

__all__ = ["Effect", "KeyedBatch", "KeyedHandler", "Message"]


@dataclass(frozen=True, slots=True)
class Effect:
    """One stream entry a handler asked to write (:meth:`KeyedBatch.emit`)."""

    stream: str
    fields: tuple[Any, ...]
    #: The IDMP producer id and iid: the key's data stream, and "<message id>:<n>".
    producer: str
    iid: str


@dataclass(slots=True)
class KeyedBatch:
    """A batch of one key's messages, handed to a keyed handler in order.

    Returning commits the position after the last message (fenced by
    ``token``: a holder that lost the key can never move it); raising hands
    the key back with the position where it was.
    """

    #: The key (its data stream's name in the LBS).
    key: str
    #: The fencing token of this hold: only grows across holders of the service.
    token: int
    #: The LBS entry this hold came from.
    entry_id: str
    #: How many holds before this one started at this position and did not commit past it.
    retry_count: int
    #: The messages, in order (one at a time after a failure, to find a poison message).
    messages: list[Message]
    #: The key's data stream in Redis (``{<service>-input}:k:<key>``).
    data_stream: str = ""
    #: What :meth:`emit` asked for, written before the commit.
    effects: list[Effect] = field(default_factory=list)

    def emit(self, stream: str, fields: Mapping[Union[str, bytes], Union[str, bytes, int, float]],
             message: Message | None = None) -> None:
        """Write an entry to ``stream`` when this batch commits, at most once per message.

        ``message`` (default: the batch's last) names the source message: the
        entry is added with ``XADD ... IDMP <key's data stream> <message id>:<n>``
        (Redis >= 8.6), so a batch processed again after a failover (the
        holder died between writing and committing) adds nothing twice. On
        older servers it is a plain XADD: at least once. ``stream`` must live
        on the key's node on a cluster (give it the key's hash tag).
        """
        source = message if message is not None else self.messages[-1]
        n = sum(1 for e in self.effects if e.iid.rpartition(":")[0] == source.id)
        flat: list[Any] = []
        for name, value in fields.items():
            flat += (name, value)
        self.effects.append(Effect(stream, tuple(flat), self.data_stream, f"{source.id}:{n}"))


#: A keyed handler: ``await handler(batch)``.
KeyedHandler = Callable[[KeyedBatch], Awaitable[Any]]
