"""What a keyed handler receives: one held key and a batch of its messages, in order.

See :meth:`lbs.Client.run_keyed` (the consumer) and :class:`lbs.Publisher`
(the producer). The checks a message's fields get here are the ones both
sides apply: :meth:`lbs.Publisher.publish_many` refuses what
:meth:`KeyedBatch.emit` would, and what a consumer could not dead-letter
whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis.crc import key_slot

from _lbscore import Message

from .exceptions import InvalidInputError

__all__ = ["MAX_FIELDS", "Effect", "Fields", "KeyedBatch", "KeyedHandler", "Message"]

#: A message's (or an effect's) fields: names to values (str, bytes, int or float).
Fields = Mapping[str | bytes, str | bytes | int | float]

#: The most fields (name-value pairs) a message or an effect may have. A dead letter
#: adds seven of lbs's own, and Redis's Lua unpacks at most about 8,000 values in one
#: call: a message the scripts could not copy whole into a dead letter is refused when
#: it is published, an effect when it is emitted.
MAX_FIELDS = 1000


class Effect(NamedTuple):
    """One stream entry a handler asked to write (:meth:`KeyedBatch.emit`)."""

    stream: str
    #: ``(name, value, name, value, ...)``.
    fields: tuple[Any, ...]
    #: The id of the message it stems from.
    message_id: str


@dataclass(slots=True)
class KeyedBatch:
    """A batch of one key's messages, handed to a keyed handler in order.

    Returning commits the position after the last message together with
    the batch's effects (fenced by ``token``: a holder that lost the key
    moves nothing and writes nothing); raising hands the key back with the
    position where it was.
    """

    #: The key (its data stream's name in the LBS).
    key: str
    #: The fencing token of this hold: only grows across holders of the service.
    token: int
    #: The LBS entry this hold came from.
    entry_id: str
    #: Failed holds that may have involved this batch's first message (0 on a first try).
    retry_count: int
    #: The messages, in order (one at a time while a failure is being isolated).
    messages: list[Message]
    #: The key's data stream in Redis (``{<service>-input}:k:<key>``).
    data_stream: str = ""
    #: What :meth:`emit` asked for, written with the commit.
    effects: list[Effect] = field(default_factory=list)
    #: On a cluster, the slot every effect's stream must hash to (the key's); None elsewhere.
    slot: int | None = field(default=None, repr=False)

    def emit(self, stream: str, fields: Fields, message: Message | None = None) -> None:
        """Write an entry to ``stream`` when this batch commits, in the same atomic step.

        The entry is added (``XADD <stream> * <fields>``) only by the commit
        that moves the key's position past this batch, and only while this
        hold still owns the key: exactly once per successful batch, and
        never by a holder that lost the key (stalled past its lease TTL, cut
        off). When the handler raises, the batch's effects are dropped.
        ``message`` (default: the batch's last) names the source message
        (:attr:`Effect.message_id`). On a cluster ``stream`` must hash to the
        key's slot: name it with the key's hash tag
        (``{<service>-input}:...``, the prefix of :attr:`data_stream`).

        Raises :class:`lbs.InvalidInputError` (the batch then fails, like any
        exception of the handler) for a stream name that is not a non-empty
        str, fields that are not a non-empty mapping of str/bytes to
        str/bytes/int/float, text UTF-8 cannot encode (a lone surrogate),
        more than :data:`MAX_FIELDS` fields, or, on a cluster, a stream in
        another slot. The stream must be a stream (or not exist) when the
        batch commits: one of another type fails the batch.
        """
        if type(stream) is not str or not stream or not stream.isascii():
            _check_stream(stream)
        if self.slot is not None and key_slot(stream.encode()) != self.slot:
            prefix = self.data_stream.partition("}:")[0] + "}:"
            raise InvalidInputError(
                f"emit: stream {stream!r:.100} is not in the slot of key {self.key!r:.100} "
                f"on this cluster; give it the key's hash tag ({prefix}...)"
            )
        try:
            flat = flatten_fields(fields)
        except InvalidInputError as exc:
            raise InvalidInputError(f"emit to {stream!r:.100}: {exc}") from None
        source = message if message is not None else self.messages[-1]
        self.effects.append(Effect(stream, tuple(flat), source.id))


def _check_stream(stream: object) -> None:
    if not isinstance(stream, str) or not stream:
        raise InvalidInputError(f"emit: the stream must be a non-empty str, got {stream!r:.100}")
    _check_text(stream, "emit: the stream name")


def flatten_fields(fields: object) -> list[Any]:
    """``[name, value, ...]`` of a message's or an effect's fields, or InvalidInputError saying what is wrong."""
    if not isinstance(fields, Mapping) or not fields:
        raise InvalidInputError(f"fields must be a non-empty mapping, got {type(fields).__name__}")
    if len(fields) > MAX_FIELDS:
        raise InvalidInputError(f"{len(fields)} fields, more than the limit of {MAX_FIELDS}")
    flat: list[Any] = []
    for name, value in fields.items():
        kind = type(value)
        if kind is str:
            if not value.isascii():
                _check_text(value, f"the value of field {name!r:.50}")
        elif kind is not bytes and kind is not int and kind is not float:
            if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
                raise InvalidInputError(
                    f"field {name!r:.50} must map a str or bytes name to a str, bytes, int "
                    f"or float, got {type(value).__name__}"
                )
            if isinstance(value, str):
                _check_text(value, f"the value of field {name!r:.50}")
        if type(name) is not str or not name.isascii():
            if isinstance(name, str):
                _check_text(name, f"field name {name!r:.50}")
            elif not isinstance(name, bytes):
                raise InvalidInputError(
                    f"field {name!r:.50} must map a str or bytes name to a str, bytes, int "
                    f"or float, got a {type(name).__name__} name"
                )
        flat.append(name)
        flat.append(value)
    return flat


def _check_text(text: str, what: str) -> None:
    """InvalidInputError when UTF-8 cannot encode ``text`` (a lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{what} contains {exc.object[exc.start : exc.end]!r} at position {exc.start}, "
            f"which UTF-8 cannot encode ({exc.reason}: a lone surrogate)"
        ) from None


#: A keyed handler: ``await handler(batch)``.
KeyedHandler = Callable[[KeyedBatch], Awaitable[Any]]
