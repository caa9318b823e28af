"""Publishing messages by key: the producer side of keyed, ordered processing.

A *key* (a ticket, a session, a device) is a data stream whose messages must
be processed one by one, in order, by one consumer at a time.
:meth:`Publisher.publish_many` appends each message to its key's data stream
(``{<service>-input}:k:<key>``) and, in the same atomic call
(``publish-1.lua``), registers in the load-balancer stream every key that
nobody holds or has queued. A consumer's :meth:`lbs.Client.run_keyed` takes
the key, processes its messages in order and lets it go only when it is
drained, atomically with that check, so a message is never stranded in a
data stream nobody will be assigned.

Keys are routed to shards like :class:`lbs.Producer` routes data streams
(``shards=N``: the key's shard is ``crc32(key) % N``); a key's data stream
and state carry its shard's hash tag, so every step is one call in one slot.

A delayed publish (``delay=`` or ``at=``) is parked as a scheduled registration is
(:mod:`lbs._schedule`): one entry per call and shard in ``{<service>-input}:delayed``, its fields
``lbs-publish``, the message count, then ``publish-1.lua``'s arguments per message; its id scored in
``{<service>-input}:due``. Every consumer's promotion task (``promote-4.lua``) publishes it when
due, as one ``publish-1.lua`` call with those messages would, atomically with its removal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from _lbscore import encode_input as _core_encode

from . import _keys, _schedule
from ._keys import shard_of
from ._redis import scripts
from ._redis.connection import redirected
from ._redis.routes import Sender
from .exceptions import InvalidInputError, RedisOperationError
from .keyed import Fields, flatten_fields
from .producer import encode_input

__all__ = ["Fields", "Publisher"]

#: The first field of a delayed publish's parked entry (its value: the message count).
_PUBLISH_FIELD = "lbs-publish"


class Publisher(Sender):
    """Publishes messages by key for :meth:`lbs.Client.run_keyed` consumers of ``service``.

    ``redis`` is a ``redis.asyncio.Redis`` (or cluster) client, left open by
    :meth:`close`, or a URL (lbs opens the client and closes it). ``shards``
    must match the consumers' (see :mod:`lbs.sharding`).

    Nothing a consumer would dead-letter whole is sent: a key's registration
    is judged by the consumers' own entry parser with ``max_input_bytes`` as
    the size limit (keep it at or below the consumers'
    ``Config.max_input_bytes``; both default to 65,536), so a key too long
    to register is refused here, not dead-lettered with every message
    published to it.

    Plugins (``plugins=``, and the installed ones unless ``load_entrypoint_plugins=False``) may
    add fields to every message (hook ``lbs_message_fields``: ``lbs-otel`` adds the W3C trace
    context), which a keyed handler sees among the message's fields.
    """

    # One call per shard, sent over lbs's own connection to the Redis serving its LBS: never re-sent
    # after a connection failure (publish-1 is not idempotent), re-sent after NOSCRIPT (it ran
    # nowhere) or, on a cluster, a redirect (the slot moved: it ran nowhere).
    _scripts = (scripts.PUBLISH.source,)

    async def publish(
        self,
        key: str,
        fields: Fields,
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> str:
        """Append one message to ``key``'s data stream (registering the key if nobody has it); its
        id, or, with ``delay`` or ``at``, its parked id (see :meth:`publish_many`)."""
        return (await self.publish_many([(key, fields)], delay=delay, at=at))[0]

    async def publish_many(
        self,
        messages: Iterable[tuple[str, Fields]],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> list[str]:
        """Publish ``(key, fields)`` messages, in order per key; their ids, in input order.

        One atomic call per shard (all shards at once): a shard's messages
        are all appended, and its keys registered, or none is. Raises
        :class:`lbs.InvalidInputError` before sending anything for a key that
        is not a non-empty str or whose registration would be bigger than
        ``max_input_bytes``, fields that are not a non-empty mapping of
        str/bytes to str/bytes/int/float or number more than
        :data:`lbs.keyed.MAX_FIELDS`, and text UTF-8 cannot encode (a lone
        surrogate) anywhere; and :class:`lbs.RedisOperationError`
        when Redis fails. A call whose connection failed is not sent again (it
        may have published: sending it again could publish twice); one that
        met NOSCRIPT or, on a cluster, a redirect ran nowhere and is.

        ``delay`` (seconds, or a :class:`~datetime.timedelta`) or ``at`` (a
        :class:`~datetime.datetime` with a time zone) publish them later: each
        shard's messages are parked whole, as one entry of
        ``{<service>-input}:delayed`` due at the Redis server's time plus
        ``delay`` (or at ``at``), and a running consumer publishes them, all
        at once and exactly as this call would have, within a second of that
        (never before; with no consumer running they wait for the first one).
        A key's messages are in the order they reach its data stream: a
        delayed message comes after every message published before it was due.
        The ids returned are then the parked entries' (the same for every
        message of a shard). A delay of 0, or an ``at`` already past,
        publishes now. :class:`lbs.ConfigurationError` for both ``delay`` and
        ``at``, a negative delay, a naive ``at`` (before anything is sent).
        """
        due = _schedule.due_ms(delay, at)
        per_shard: dict[int, list[tuple[int, str, list[Any]]]] = {}
        first: dict[str, int] = {}  # each key's first message
        n = 0
        for n, item in enumerate(messages, 1):
            key, fields = _check(item, n - 1)
            first.setdefault(key, n - 1)
            shard = shard_of(key, self.shards) if self.shards > 1 else 0
            per_shard.setdefault(shard, []).append((n - 1, key, fields))
        ids: list[str] = [""] * n
        if not n:
            return ids
        registrations = self._registrations(first)
        extra = self._message_fields()  # the plugins' fields, added to every message
        if due is not None:
            return await self._park(per_shard, registrations, extra, due, ids)
        calls = []
        for shard, items in per_shard.items():
            seen: set[str] = set()
            batch = []
            for _, key, fields in items:
                batch.append(
                    (
                        key,
                        "" if key in seen else registrations[key],
                        fields + extra if extra else fields,
                    )
                )
                seen.add(key)
            calls.append(self._call(self.services[shard], batch))
        replies = await asyncio.gather(*calls, return_exceptions=True)
        for (_shard, items), reply in zip(per_shard.items(), replies):
            if isinstance(reply, BaseException):
                if isinstance(reply, (RedisError, RedisClusterException)):
                    raise RedisOperationError("publish", reply) from reply
                raise reply
            for (k, *_), message_id in zip(items, reply[0]):
                ids[k] = message_id.decode() if isinstance(message_id, bytes) else str(message_id)
        return ids

    async def _park(
        self,
        per_shard: dict[int, list[tuple[int, str, list[Any]]]],
        registrations: dict[str, str],
        extra: list[str],
        due: tuple[bool, int],
        ids: list[str],
    ) -> list[str]:
        """Park each shard's messages as one delayed publish (``promote-4.lua``'s header has its
        fields), all shards at once; ``ids`` filled with each message's parked id."""
        shards = list(per_shard.items())
        entries = []
        for _shard, items in shards:
            entry: list[Any] = [_PUBLISH_FIELD, len(items)]
            seen: set[str] = set()
            for _, key, fields in items:
                flat = fields + extra if extra else fields
                entry += (key, "" if key in seen else registrations[key], len(flat), *flat)
                seen.add(key)
            if len(items) % 2:
                entry.append("")  # name-value pairs: an even count
            entries.append(entry)
        replies = await asyncio.gather(
            *(
                self._park_entries(self.services[shard], [entry], due, "publish")
                for (shard, _), entry in zip(shards, entries)
            ),
            return_exceptions=True,
        )
        for (_shard, items), reply in zip(shards, replies):
            if isinstance(reply, BaseException):
                raise reply
            for k, *_ in items:
                ids[k] = reply[0]
        return ids

    def _registrations(self, first: dict[str, int]) -> dict[str, str]:
        """The lbs-input value registering each key (``first``: the key's first message), or
        InvalidInputError for one a consumer would dead-letter, judged by the consumers' parser."""
        payloads: dict[str, bytes] = {}
        for key, k in first.items():
            try:
                payloads[key] = _core_encode(key, {})
            except (InvalidInputError, UnicodeEncodeError):
                try:
                    encode_input(key, {})  # raises, with the reason
                except InvalidInputError as exc:
                    raise InvalidInputError(f"message {k}: {exc}") from None
                raise
        field = _keys.INPUT_FIELD.encode()
        judged = self._judge.parse_entries([[b"", [field, p]] for p in payloads.values()])
        for (key, _payload), entry in zip(payloads.items(), judged):
            if entry.error is not None:
                raise InvalidInputError(
                    f"message {first[key]}: key {key!r:.100}: its registration {entry.error}; "
                    "a consumer would dead-letter it"
                )
        return {key: payload.decode() for key, payload in payloads.items()}

    async def _call(self, service: str, batch: list[tuple[str, str, list[Any]]]) -> Any:
        stream = _keys.input_stream(service)
        for attempt in range(2):
            _, wire = await self._routes.wire_for(stream)
            (reply,) = await wire.execute(
                lambda b: scripts.publish(b, stream, _keys.key_prefix(service), batch)
            )
            if attempt == 0 and redirected(reply):  # the call ran nowhere
                if self._routes.cluster:
                    await self._routes.forget()  # the slot moved
                continue  # else READONLY, a demoted master: the wire reconnects (Sentinel: the new one)
            if isinstance(reply, Exception):
                raise reply
            return reply
        raise reply  # redirected twice

    async def __aenter__(self) -> Publisher:
        return self


def _check(item: object, k: int) -> tuple[str, list[Any]]:
    """``(key, flat fields)`` of message ``k``, or InvalidInputError."""
    if not isinstance(item, tuple) or len(item) != 2:
        raise InvalidInputError(
            f"message {k}: expected a (key, fields) pair, got {type(item).__name__}"
        )
    key, fields = item
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"message {k}: the key must be a non-empty str, got {key!r:.100}")
    try:
        return key, flatten_fields(fields)
    except InvalidInputError as exc:
        raise InvalidInputError(f"message {k} of key {key!r:.100}: {exc}") from None


def publish_in_transaction(pipe: Any, service: str, key: str, fields: Fields) -> None:
    """Queue the publishing of one message of ``key`` on ``pipe``, a redis-py pipeline in a MULTI of
    the caller's (``lbs dlq replay`` moves a keyed letter back this way, atomically with its XDEL).

    ``service`` is the shard's service. The script goes by its source (EVAL): a NOSCRIPT inside
    EXEC would fail this command alone and let the rest of the transaction through. Read the
    message id from the reply with :func:`published_id`.
    """
    key, flat = _check((key, fields), 0)
    pipe.eval(
        scripts.PUBLISH.source,
        1,
        _keys.input_stream(service),
        *scripts.publish_args(
            _keys.key_prefix(service), [(key, encode_input(key, {}).decode(), flat)]
        ),
    )


def published_id(reply: Any) -> str:
    """The message id in the reply of one :func:`publish_in_transaction`."""
    message_id = reply[0][0]
    return message_id.decode() if isinstance(message_id, bytes) else str(message_id)
