"""What a consumer's activities share: its names, its link to Redis, its holdings, its signals.

One :class:`ClientState` per :class:`lbs.Client`, handed to every activity (reader, heartbeat,
finisher, runner, requeue, recovery, topology, instance, forwarder, controls). Each activity owns
its own state; here lives only what two or more of them read or change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis.asyncio as aioredis

from _lbscore import Entry, EntryParser, Held, HeldTable

from .. import _keys
from .._redis import scripts
from .._redis.acl import denied_rule
from .._redis.wire import Wire
from ..config import Config
from ..exceptions import ConfigurationError, NotHeldError
from ..logs import about
from ..notifications import Mailbox, Notification, NotificationType
from ..plugins import Hooks
from ..strategy import ReadStrategy
from .journal import Journal
from .lease import Lease
from .slots import SharedSlots
from .stats import ClientStats, Histogram

__all__ = [
    "ClientState",
    "ClientStats",
    "ConsumerLog",
    "Histogram",
    "Holdings",
    "Lease",
    "Link",
    "Names",
    "Server",
    "consumer_id_from_env",
]

CONSUMER_PREFIX = "redis-consumer-"
#: How many recently disowned streams ``done_stream`` still recognises.
TOMBSTONES = 10_000


@dataclass(frozen=True, slots=True)
class Names:
    """Every key and name one consumer uses (see lbs._keys)."""

    service: str
    #: The consumer id (the consumer's name in the group).
    id: str
    #: This process's instance nonce.
    instance: str
    stream_key: str
    group: str
    fence_key: str
    consumers_key: str
    #: ``{<service>-input}:lease:<consumer id>``: this consumer's lease (lbs._keys.lease_key).
    lease_key: str
    #: ``{<service>-input}:lease:``: a consumer's lease is this plus its id.
    lease_prefix: str
    #: ``{<service>-input}:tokens:``: a consumer's token records are this plus its id.
    tokens_prefix: str
    reaped_key: str
    #: The dead-letter stream; "" when dead letters are dropped (``Config.dead_letter_stream=""``).
    dead_letter_key: str
    #: ``lock:{<service>-input}:``: what the core's held records build ``Held.lock_key`` from (the
    #: lock per entry's key; lbs writes no such key under the consumer lease).
    lock_key_prefix: str
    retry_field: str
    original_field: str
    field_prefix: str
    #: ``<consumer id>:<instance>``: a held value is ``<token>:<lock owner>`` while the lease holds
    #: its first value (taken again, the lease's value is ``<instance>.<n>``).
    lock_owner: str
    #: :attr:`lock_key_prefix` as bytes.
    lock_prefix: bytes
    #: ``{<service>-input}:``: keyed processing's data streams and key states start with it.
    key_prefix: str
    #: ``{<service>-input}:queued:``; a consumer's queued set is this plus its id.
    queued_prefix: str

    @property
    def tokens_key(self) -> str:
        """This consumer's token records (lbs._keys.tokens_prefix)."""
        return self.tokens_prefix + self.id

    @property
    def paused_key(self) -> str:
        """The service's pause (lbs._keys.paused_key)."""
        return _keys.paused_key(self.service)

    @property
    def orders_key(self) -> str:
        """What operators asked this consumer to do with streams it holds (lbs._keys.orders_key)."""
        return _keys.orders_key(self.service, self.id)

    @property
    def queued_key(self) -> str:
        """This consumer's queued set: what it read for the application that the application has not taken."""
        return self.queued_prefix + self.id

    @classmethod
    def of(cls, service: str, consumer_id: str, instance: str, config: Config) -> Names:
        dlq = config.dead_letter_stream
        prefix = config.field_prefix
        return cls(
            service,
            consumer_id,
            instance,
            _keys.input_stream(service),
            _keys.group_name(service),
            _keys.fence_key(service),
            _keys.consumers_key(service),
            _keys.lease_key(service, consumer_id),
            _keys.lease_prefix(service),
            _keys.tokens_prefix(service),
            _keys.reaped_key(service),
            _keys.dead_letter_stream(service) if dlq is None else dlq,
            _keys.lock_key(service, ""),
            prefix + "retry_count",
            prefix + "original_id",
            prefix,
            f"{consumer_id}:{instance}",
            _keys.lock_key(service, "").encode(),
            _keys.key_prefix(service),
            _keys.queued_prefix(service),
        )


class Link:
    """The connections to the Redis that serves the service (on a cluster: the slot's owner).

    Rebuilt whole when the slot moves (:mod:`lbs._consumer.topology`); an
    activity reads ``state.link`` each time rather than keeping one.
    """

    def __init__(self, redis: aioredis.Redis, node: str = "") -> None:
        self.redis = redis
        #: ``host:port`` of the slot's owner (cluster only).
        self.node = node
        sources = scripts.sources()
        #: The hot paths' own held connections: read, finish, heartbeat.
        self.read = Wire(redis, sources, track_id=True)
        self.done = Wire(redis, sources)
        self.beat = Wire(redis, sources)
        #: Occasional scripts (re-queue, reap, leave): a pool connection per batch.
        self.pool = Wire(redis, sources, hold=False)
        #: run_keyed()'s round trips, two at once (a connection each, taken on first use).
        self.keyed = (Wire(redis, sources), Wire(redis, sources))

    async def close(self, log: logging.LoggerAdapter | None = None) -> None:  # type: ignore[type-arg]
        """Give back the wires' connections (best effort: other tasks may be mid-command)."""
        for wire in (self.read, self.done, self.beat, self.pool, *self.keyed):
            try:
                await wire.close()
            except Exception as exc:
                if log is not None:
                    log.debug("closing a connection: %s", exc)


@dataclass(slots=True)
class Server:
    """What the client knows of the server it talks to."""

    version: tuple[int, ...] = ()
    #: Its run id at the last look: a change means it restarted.
    run_id: str = ""
    #: What it is, for people: "Redis 8.6.3", "Valkey 9.1.2" (``version`` is the Redis version it
    #: is compatible with, what the feature checks go by, beside :attr:`valkey`).
    name: str = ""
    #: Valkey's own version (``valkey_version``), ``()`` on Redis: Valkey answers as Redis 7.2.4.
    valkey: tuple[int, ...] = ()

    @property
    def xackdel(self) -> bool:
        """XACKDEL exists (Redis >= 8.2; not in Valkey 9.1)."""
        return self.version >= (8, 2)

    @property
    def plain_done(self) -> bool:
        """XACKDEL and ``DELEX ... IFEQ`` exist (Redis >= 8.4; not Valkey 9.1): done needs no Lua."""
        return self.version >= (8, 4)

    @property
    def set_ifeq(self) -> bool:
        """``SET ... IFEQ`` (with ``GET``) exists (Redis >= 8.4, Valkey >= 9.1): a tick needs no Lua."""
        return self.version >= (8, 4) or self.valkey >= (9, 1)

    @property
    def msetex(self) -> bool:
        """MSETEX exists, with Redis 8.4's syntax and all-or-none NX (Redis >= 8.4, Valkey >= 9.1)."""
        return self.version >= (8, 4) or self.valkey >= (9, 1)


class Holdings:
    """The held streams (the core's :class:`HeldTable`) and the recently disowned ones.

    Dropping a held stream frees a slot: the reader, waiting on
    :attr:`freed`, reads again. A held stream's value is ``<token>:<consumer id>:<lease value>``
    (the keyed scripts check it against the lease).
    """

    def __init__(self, names: Names, lease: str) -> None:
        self.consumer = names.id
        self._prefix = names.lock_key_prefix
        self.table = HeldTable(f"{names.id}:{lease}", self._prefix)
        #: Disowned streams by name, newest last: done_stream still finishes them (LOCK_LOST, or DONE
        #: where the entry was still pending to us under the lease it was read under).
        self.tombstones: OrderedDict[str, Held] = OrderedDict()
        #: Set when a slot frees (a stream dropped, or the client closing): the reader reads again.
        self.freed = asyncio.Event()
        #: Slots freed so far (:meth:`free`): a reader that looked before compares, since the event may
        #: have been set and cleared meanwhile.
        self.frees = 0
        #: Called on each freed slot besides (the shared slots waking the other clients' readers).
        self.on_free: Callable[[], None] | None = None
        #: Held entries whose keyed commit is in flight: it may let the key go, so a heartbeat that
        #: finds the lease gone meanwhile leaves them to the commit's reply instead of disowning them.
        self.settling: set[str] = set()
        #: Held keys kept drained under ``run_keyed(linger=...)`` (entry ids): they take no slot.
        self.lingering: set[str] = set()
        #: Held streams per batch token (a read records each batch in the consumer's token
        #: records for `lbs status`), and the tokens of batches finished since the last tick: the
        #: heartbeat deletes their records.
        self._batches: dict[int, int] = {}
        self.finished_batches: list[int] = []

    def __len__(self) -> int:
        return len(self.table)

    def renew(self, lease: str) -> None:
        """The lease was taken again with value ``lease``: what is taken from now on is held under it.
        What is still held (a keyed commit in flight, :attr:`settling`) keeps the lapsed lease's value,
        so that commit is refused unless it ran before the lease lapsed; its reply drops it."""
        old, self.table = self.table, HeldTable(f"{self.consumer}:{lease}", self._prefix)
        for h in old.values():
            self.table.add(h)

    def take(
        self, entry: Entry, token: int, retry_count: int, taken_at: float, queued: bool
    ) -> Held:
        """Hold ``entry`` (:meth:`HeldTable.take`), counted in its batch."""
        h = self.table.take(entry, token, retry_count, taken_at, queued)
        self._batches[token] = self._batches.get(token, 0) + 1
        return h

    def batches_seen(self, tokens: Iterable[int]) -> None:
        """A reply's batch tokens: one none of whose entries is held (all malformed, or refused) is done."""
        for token in tokens:
            if token not in self._batches:
                self.finished_batches.append(token)

    def drop(self, h: Held) -> bool:
        """Forget ``h``; False if it was not (or no longer) held."""
        if not self.table.drop(h):
            return False
        self.lingering.discard(h.entry_id)
        left = self._batches.pop(h.token, 0) - 1
        if left > 0:
            self._batches[h.token] = left
        else:
            self.finished_batches.append(h.token)
        self.free()
        return True

    def free(self) -> None:
        """A slot freed (a stream dropped, a handler ended): the reader (and those sharing the slots,
        :mod:`lbs._consumer.slots`) may read again."""
        self.frees += 1
        self.freed.set()
        if self.on_free is not None:
            self.on_free()

    def find(self, stream: str, entry_id: str | None = None) -> Held:
        """The held assignment of ``stream`` (``entry_id`` picks one, else the oldest); :class:`lbs.NotHeldError`."""
        _check_name(stream, entry_id)
        h = self.table.find(stream, entry_id)
        if h is None:
            raise NotHeldError(f"{self.consumer} does not hold data stream {stream!r}")
        return h

    def to_finish(self, items: Iterable[tuple[str, str | None]]) -> list[Held]:
        """What ``done_stream(s)`` finishes: per (stream, entry id), a held assignment or a recently
        disowned one (then mostly LOCK_LOST); all dropped, or :class:`lbs.NotHeldError` for any
        not held, with nothing dropped. A name given twice takes its next held assignment."""
        picked: list[Held] = []
        for stream, entry_id in items:
            _check_name(stream, entry_id)
            h = self.table.find(stream, entry_id)
            if h is None:
                h = self.tombstones.get(stream)
                if h is None or (entry_id is not None and h.entry_id != entry_id) or h in picked:
                    raise NotHeldError(f"{self.consumer} does not hold data stream {stream!r}")
            elif h in picked:
                rest = [x for x in self.table.for_stream(stream) if x not in picked]
                if not rest:
                    raise NotHeldError(
                        f"{self.consumer} does not hold data stream {stream!r} that many times"
                    )
                h = rest[0]
            picked.append(h)
        for h in picked:
            if not self.drop(h):
                self.tombstones.pop(h.stream, None)
        return picked

    def tombstone(self, h: Held) -> None:
        self.tombstones[h.stream] = h
        self.tombstones.move_to_end(h.stream)
        while len(self.tombstones) > TOMBSTONES:
            self.tombstones.popitem(last=False)


def consumer_id_from_env(explicit: str | None = None) -> str:
    """The consumer id: ``explicit``, else ``$POD_NAME``, else ``$POD_IP``,
    prefixed ``redis-consumer-`` (the Go client's rule)."""
    if explicit is not None and not isinstance(explicit, str):
        raise ConfigurationError(f"consumer_id must be a str, got {type(explicit).__name__}")
    raw = explicit or os.environ.get("POD_NAME") or os.environ.get("POD_IP")
    if not raw:
        raise ConfigurationError(
            "no consumer id: pass consumer_id=..., or set POD_NAME or POD_IP in the environment"
        )
    if any(c.isspace() for c in raw):
        raise ConfigurationError(f"consumer id must not contain whitespace: {raw!r}")
    return raw if raw.startswith(CONSUMER_PREFIX) else CONSUMER_PREFIX + raw


def _check_name(stream: object, entry_id: object) -> None:
    """Refuse arguments that cannot name a held stream (a caller's mistake, not "not held")."""
    if not isinstance(stream, str):
        raise ConfigurationError(f"a data stream name is a str, got {type(stream).__name__}")
    if entry_id is not None and not isinstance(entry_id, str):
        raise ConfigurationError(f"entry_id must be a str or None, got {type(entry_id).__name__}")


class ConsumerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Puts the consumer id in every record (message prefix and ``record.consumer_id``) and its service."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        kwargs.setdefault("extra", {}).update(extra)
        return f"[{extra.get('consumer_id')}] {msg}", kwargs

    def on(self, held: Any, *, keyed: bool = False) -> ConsumerLog:
        """This log, its records about one held assignment (:func:`lbs.logs.about`: stream or key,
        entry id, token, retry count as record attributes, fields in ``--log-format json``)."""
        return ConsumerLog(self.logger, {**(self.extra or {}), **about(held, keyed=keyed)})


class ClientState:
    """What the activities of one client share (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        names: Names,
        hooks: Hooks,
        log: ConsumerLog,
        link: Link,
        owner: Any,
        slots: SharedSlots | None = None,
    ) -> None:
        self.config = config
        self.names = names
        self.hooks = hooks
        self.log = log
        #: The connections to the serving Redis (replaced when the slot moves).
        self.link = link
        #: The public client: what notifications hold and plugins receive.
        self.owner = owner
        self.server = Server()
        self.parser = EntryParser(
            _keys.INPUT_FIELD, names.retry_field, names.original_field, config.max_input_bytes
        )
        #: This process's lease value (a new one each time the lease is taken again).
        self.lease = Lease(names.instance)
        self.holdings = Holdings(names, self.lease.value)
        self.mailbox: Mailbox[Notification] = Mailbox(config.notification_buffer)
        self.stats = ClientStats()
        self._finished = asyncio.Event()  # set whenever a stream finished (wait_finished)
        #: Set once, when the client starts closing: every loop ends.
        self.stopping = asyncio.Event()
        #: How this client reads new work (hook ``lbs_reader``; set at start).
        self.strategy = ReadStrategy(name="default")
        #: How many streams this client holds at most: ``max_streams``, or run()'s ``concurrency``.
        self.capacity = config.max_streams
        #: The slots shared with other clients of the process (a ShardedClient's shards), or None.
        self.slots = slots
        #: What this client's reads of new entries in flight asked for (counted by the other members).
        self.reading = 0
        if slots is not None:
            slots.join(self)
            self.holdings.on_free = partial(slots.wake, self)
        #: Under run(): its concurrency (0: not running), and its running handler tasks.
        self.run_limit = 0
        #: Whether the last read of new entries got all the several it asked for, without waiting:
        #: a backlog is being drained.
        self.backlog = False
        #: What ``run()`` died of (see :meth:`fail`); None while it lives, or when it ended normally.
        self.failure: BaseException | None = None
        self.handlers: set[asyncio.Task[Any]] = set()
        #: The ACL rules found missing so far (each logged once).
        self._denied: set[str] = set()
        #: What happened, for ``{<service>-input}:events`` (a no-op with ``Config.journal=False``).
        self.journal = Journal(self)

    def denied(self, exc: BaseException, doing: str) -> bool:
        """Whether ``exc`` is an ACL denial; if so it is logged at WARNING, once per missing rule, with
        the rule that would allow it (so a background task that keeps failing on it says why once)."""
        rule = denied_rule(exc)
        if rule is None:
            return False
        if rule not in self._denied:
            self._denied.add(rule)
            self.log.warning(
                "%s: the ACL denies it (%s); add %s to the user's rules (see the Minimal ACL "
                "section of docs/operations.md)",
                doing,
                exc,
                rule,
            )
        return True

    def count_finished(self) -> None:
        """One stream finished (done, or found lost), by the finisher or a keyed holder letting it go."""
        self.stats.finished += 1
        self._finished.set()

    async def wait_finished(self, count: int) -> None:
        """Until ``stats.finished`` reaches ``count``; raises the client's :attr:`failure` once there is one."""
        while self.stats.finished < count:
            if self.failure is not None:
                raise self.failure
            self._finished.clear()
            await self._finished.wait()

    def let_go(self, h: Held, reason: str) -> None:
        """``h`` is no longer this client's (its lease lost, an operator's order; dropped from the table
        by the caller): a done of it says LOCK_LOST, its handler is cancelled, STREAM_DISOWNED sent."""
        self.holdings.tombstone(h)
        if h.task is not None and not h.task.done():
            h.task.cancel(reason)
        note = (h.stream, h.entry_id, h.info, h.retry_count, h.token, reason)
        self.mailbox.put_nowait(Notification(NotificationType.STREAM_DISOWNED, *note))

    def fail(self, exc: BaseException) -> None:
        """``run()`` (or ``run_keyed()``) died of ``exc``: every waiter raises it now, none waits forever
        (``wait_finished``; the notifications, once the buffered ones are read)."""
        if self.failure is None:
            self.failure = exc
        self._finished.set()
        self.mailbox.close()

    @property
    def read_count(self) -> int:
        """Most entries one read asks for: ``Config.read_count``, or half the capacity (at most 500)."""
        count = self.config.read_count
        return count if count is not None else max(1, min(self.capacity // 2, 500))

    def free_slots(self, taking: int = 0) -> int:
        """How many more streams may be taken now (the capacity, and under run() its handlers; shared
        slots count the other clients' too)."""
        if self.slots is not None:
            return self.slots.free(self, taking)
        free = self.capacity - len(self.holdings) + len(self.holdings.lingering) - taking
        if self.run_limit:
            free = min(free, self.run_limit - len(self.handlers) - taking)
        return free
