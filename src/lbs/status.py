"""One service's state, read from Redis in two pipelined round trips (``lbs status``).

:func:`collect_status` reads everything lbs keeps for a service and returns
a frozen :class:`ServiceStatus` (``to_dict()`` is JSON-ready):

* the load-balancer stream: its length, the **backlog** (entries not yet
  delivered to the group) with how it was obtained, the oldest waiting entry
  and, among the newest waiting entries, how many are re-queued copies
  (``_original_id``), with a retry counted (``_retry_count`` > 0) or
  replayed from the dead-letter stream (``_replayed_from``);
* the group's **pending** entries (delivered, not finished) and the oldest of
  them (its age from its id, its idle time, its holder);
* every **consumer** from ``XINFO CONSUMERS`` and the deadline index: held
  streams, idle time, seconds to its deadline, its instance marker, and
  whether it is alive, late, dead (still holding streams that wait for
  recovery) or departed (left, nothing held);
* the **dead-letter stream**: its length and the reasons of its newest letters;
* the parked **delayed retries** (``{<service>-input}:delayed`` and its due index);
* the registrations **waiting for their data stream's holder** (one holder per
  name): how many names have waiters and, for the first of them, the holding
  entry and how many wait (rounds 5 and 6, only when some do).

Round trip 1 is one MULTI/EXEC (a consistent snapshot, with the server's
``TIME``): key types, lengths, the group, its consumers, the pending summary,
the deadline index, the newest dead letters, the parked retries. Round trip 2,
also one MULTI/EXEC with its own ``TIME``, reads what depends on the first: the
entries around the group's last-delivered id and each consumer's instance
marker. Every age and deadline is the server's clock against the server's
clock, never the caller's.

Redis stores no history of recoveries (their counters live in each client's
metrics), so what can be computed from Redis alone is reported: re-queued
copies still waiting in the LBS, and the dead-letter reasons.

The backlog (entries after the group's last-delivered id) is counted where
that is cheap: the waiting entries themselves when there are fewer than
``sample``, else the entries up to the last-delivered id (the pending ones,
mostly) when there are fewer than ``sample``, subtracted from the length
(``backlog_method`` ``counted``). Only past both is Redis's ``XINFO GROUPS``
lag used (``lag``; exact from Redis 7.4: before, deletions make it wrong,
redis/redis#13338, and lbs deletes every finished entry), or, when Redis
has none, length minus pending (``estimated``). ``backlog_exact`` says which.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from _lbscore import decode_input

from . import _keys
from ._redis.connection import (
    ClusterMode,
    RedisLike,
    parse_version,
    redirected,
    resolve_client,
    server_name,
    slot_owner,
    waiting_names,
)
from ._redis.wire import fields_text, text
from .config import Config
from .exceptions import ConfigurationError, LbsError, RedisOperationError

__all__ = [
    "ConsumerState",
    "ConsumerStatus",
    "DelayedRetries",
    "HeldStream",
    "KeyStatus",
    "PendingEntry",
    "ReasonCount",
    "Requeued",
    "ServiceStatus",
    "WaitingEntry",
    "collect_status",
]

#: What a consumer looks like from Redis (see :attr:`ConsumerStatus.state`).
ConsumerState = Literal["alive", "late", "dead", "departed"]


class _Record:
    """``to_dict()`` for the frozen dataclasses below: their fields as plain JSON types."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def _plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class HeldStream(_Record):
    """A data stream (or key) a consumer holds: one of its pending entries."""

    #: The data stream's name (a keyed service: the key); "" when the entry does not decode.
    stream: str
    entry_id: str
    #: The fencing token of its lock; None when the lock is gone (its holder died: recovery takes it).
    token: int | None
    #: ms since it was registered (its entry id's time against the server's TIME).
    age_ms: int
    #: ms since it was last delivered, adopted or refreshed by its holder's heartbeat.
    idle_ms: int


@dataclass(frozen=True)
class ConsumerStatus(_Record):
    """One consumer of the group, or of the deadline index."""

    #: Its name in the group (``redis-consumer-<id>``).
    name: str
    #: Whether ``XINFO CONSUMERS`` lists it (False: only the deadline index knows it).
    in_group: bool
    #: Entries pending to it: the data streams it holds.
    pending: int
    #: ms since its last attempted interaction with the group (``XINFO CONSUMERS`` idle); None if not in the group.
    idle_ms: int | None
    #: ms since its last successful interaction (Redis >= 7.2; None before, or never).
    inactive_ms: int | None
    #: ms until its deadline in the index (negative: past); None when it is not in the index (holds no lock).
    deadline_ms: int | None
    #: Its instance marker's remaining TTL in ms (-1: no TTL); None when there is no marker.
    instance_ttl_ms: int | None
    #: What it holds, oldest entry first: among the service's first ``sample`` pending entries.
    held: tuple[HeldStream, ...] = ()

    @property
    def state(self) -> ConsumerState:
        """What Redis says of it, from lbs's own marks (the Go client leaves none):

        * ``alive``: its instance marker is there and its deadline, if it has one, is ahead;
        * ``late``: its marker is there but its deadline passed (a heartbeat is overdue, its
          locks are expiring), or it holds streams under a deadline still ahead while its marker
          is gone (it is dying);
        * ``dead``: no marker, and it still holds streams whose deadline passed (or never had one):
          they wait for recovery (every running client recovers them within the lock TTL + 1 s);
        * ``departed``: no marker and nothing held (it went away without a clean close, or its
          streams were recovered); a clean close takes its name out of the group, and the scan
          forgets a departed one after ``Config.forget_consumers_after``.
        """
        ahead = self.deadline_ms is not None and self.deadline_ms > 0
        if self.instance_ttl_ms is not None:
            return "alive" if self.deadline_ms is None or ahead else "late"
        if self.pending > 0:
            return "late" if ahead else "dead"
        return "departed"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, **super().to_dict()}


@dataclass(frozen=True)
class PendingEntry(_Record):
    """The oldest pending entry (smallest id): delivered, not finished."""

    id: str
    #: Who holds it.
    consumer: str
    #: ms since the entry was added to the LBS (its id's time against the server's TIME).
    age_ms: int
    #: ms since it was last delivered or claimed (a live holder's heartbeat refreshes it).
    idle_ms: int
    #: Times it was delivered.
    deliveries: int


@dataclass(frozen=True)
class WaitingEntry(_Record):
    """The oldest entry not yet delivered to the group."""

    id: str
    #: ms it has been waiting (its id's time against the server's TIME).
    age_ms: int


@dataclass(frozen=True)
class NameWait(_Record):
    """A data stream name whose registrations wait for its holder (one holder per name)."""

    name: str
    #: The LBS entry id holding the name: pending in the group, or (with :attr:`back`) the oldest
    #: waiter, put back into the LBS and not yet read.
    holder: str
    #: Whether :attr:`holder` is a waiter put back (nobody holds the name until it is read).
    back: bool
    #: Registrations waiting in the name's list.
    waiting: int


@dataclass(frozen=True)
class Requeued(_Record):
    """Re-queued copies among the newest waiting entries (what Redis keeps of recent recoveries)."""

    #: Waiting entries looked at (the newest ones, at most ``sample``).
    looked_at: int
    #: Whether that was every waiting entry.
    complete: bool
    #: Copies of an earlier entry (they carry ``_original_id``, or ``_replayed_from``): recovered,
    #: handed back or replayed.
    requeued: int
    #: Of these, with a failed attempt counted (``_retry_count`` > 0).
    retried: int
    #: Of these, replayed from the dead-letter stream (``_replayed_from``).
    replayed: int


@dataclass(frozen=True)
class ReasonCount(_Record):
    """One dead-letter reason and how many of the newest letters carry it."""

    reason: str
    count: int


@dataclass(frozen=True)
class DelayedRetries(_Record):
    """Failed streams parked until their retry delay is over."""

    #: The parking stream (``{<service>-input}:delayed``) and its length.
    stream: str
    parked: int
    #: The due index (``{<service>-input}:due``) and its size.
    due_key: str
    scheduled: int
    #: ms until the next one is due (negative: overdue, no client has moved it yet); None when none is.
    next_due_ms: int | None


@dataclass(frozen=True)
class KeyStatus(_Record):
    """A held key of keyed processing (:class:`lbs.Publisher`, ``run_keyed``), from a pending LBS entry."""

    key: str
    #: The consumer the LBS entry is delivered to, and the entry.
    consumer: str
    entry_id: str
    #: The last committed message id ("" for none yet).
    position: str
    #: Messages in the key's data stream (all after the position: committed ones are trimmed).
    backlog: int
    #: Holds that tried the position without committing past it (this one included).
    tries: int
    #: Whether the key's state names this entry as its holder (False: taken, not fetched yet, or a
    #: second registration that will be finished unprocessed).
    holder: bool
    #: Failed holds that may have involved the message after the position (0: none).
    failures: int = 0
    #: Whether the key is taken one message a hold, to find the message a failure came from.
    isolating: bool = False


@dataclass(frozen=True)
class ServiceStatus(_Record):
    """A service's state at one moment of the server's clock (see the module docstring)."""

    service: str
    #: The load-balancer stream's key, ``<service>-input``.
    stream: str
    group: str
    #: Whether the load-balancer stream exists. False: no such service here (the rest is empty or zero).
    exists: bool
    #: The server's version, and on a cluster the ``host:port`` of the master owning the service's slot.
    server_version: str
    node: str
    #: The server's TIME (ms since the epoch) of the first round trip.
    time_ms: int
    #: Entries in the load-balancer stream: waiting, pending, and re-queued copies.
    length: int
    group_exists: bool
    #: The group's last-delivered id ("" without a group).
    last_delivered_id: str
    #: Entries not yet delivered to the group.
    backlog: int
    #: False when :attr:`backlog` is an estimate (see :attr:`backlog_method`).
    backlog_exact: bool
    #: How the backlog was obtained: ``counted`` (the entries after the last-delivered id, or the length
    #: minus those up to it), ``lag`` (XINFO GROUPS), ``estimated`` (length minus pending), ``no group``
    #: (the length), ``none`` (no stream).
    backlog_method: str
    oldest_waiting: WaitingEntry | None
    #: Entries delivered and not finished (the group's pending list).
    pending: int
    oldest_pending: PendingEntry | None
    #: Alive, late and dead consumers first (most held first), then the departed, by name.
    consumers: tuple[ConsumerStatus, ...]
    requeued: Requeued
    #: The dead-letter stream's key ("" when dead letters are dropped) and its length.
    dead_letter_stream: str
    dead_letters: int
    #: Reasons of the newest :attr:`reasons_over` dead letters, most frequent first.
    reasons: tuple[ReasonCount, ...]
    reasons_over: int
    delayed: DelayedRetries | None = None
    #: Held keys of keyed processing, among the first ``sample`` pending entries, most backlog first
    #: (empty when the service's pending entries are not keys).
    keys: tuple[KeyStatus, ...] = ()
    #: Notes on anything odd that was read (e.g. a consumer id the index lists but the group does not).
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The server's product: "Redis" or "Valkey" (:attr:`server_version` is its own version).
    server_name: str = "Redis"
    #: Data stream names with registrations waiting for their holder (the waiting index's size).
    names_waiting: int = 0
    #: The first of them (by when the sweep looks at them again), with their holders and waiters.
    waiting_names: tuple[NameWait, ...] = ()

    def count(self, state: ConsumerState) -> int:
        """How many consumers are in ``state``."""
        return sum(1 for c in self.consumers if c.state == state)

    def to_dict(self) -> dict[str, Any]:
        """The whole status as plain JSON types (ages and deadlines in ms of the server's clock)."""
        out = super().to_dict()
        out["consumers"] = [c.to_dict() for c in self.consumers]
        out["keys"] = [k.to_dict() for k in self.keys]
        out["waiting_names"] = [w.to_dict() for w in self.waiting_names]
        out["consumer_states"] = {s: self.count(s) for s in ("alive", "late", "dead", "departed")}
        return out


# ------------------------------------------------------------------ reading ---

#: Names with waiting registrations read by rounds 5 and 6 (at most ``sample``).
WAITING_NAMES_SHOWN = 50

#: What each of a service's keys must be (besides absent), and what it is, for the error.
_ROLES = {
    "stream": "the load-balancer stream",
    "dead letters": "the dead-letter stream",
    "consumers": "the consumer deadline index",
    "delayed": "the parking stream of delayed retries",
    "due": "the due index of delayed retries",
    "waiting": "the waiting index of held names",
}
_WANTED = {
    "stream": "stream",
    "dead letters": "stream",
    "consumers": "zset",
    "delayed": "stream",
    "due": "zset",
    "waiting": "zset",
}


async def collect_status(
    redis: RedisLike,
    service: str,
    *,
    cluster: bool | ClusterMode = ClusterMode.NONE,
    config: Config | None = None,
    letters: int = 100,
    sample: int = 200,
) -> ServiceStatus:
    """Read ``service``'s status in two round trips (each one MULTI/EXEC).

    ``redis`` is a redis.asyncio client, a ``RedisCluster`` (or
    ``cluster=True``), or a URL (opened and closed here); on a cluster the
    master owning the service's slot is asked. ``config`` gives the field
    prefix and the dead-letter stream (``Config.dead_letter_stream``; a key
    of its own must share the service's slot on a cluster). ``letters``:
    how many of the newest dead letters the reasons are counted over.
    ``sample``: at most this many entries are read for each count (the
    waiting entries, newest first, for the backlog and the re-queued copies
    among them; the entries up to the last-delivered id).

    A service whose load-balancer stream does not exist is not an error: the
    status says ``exists=False``. A key of the wrong type raises
    :class:`lbs.RedisOperationError` naming the key
    (``LBSKEY <key> holds a <type>, not <what it is for>``), as does a
    failing Redis (unreachable, ACL); a bad argument raises
    :class:`lbs.ConfigurationError`.
    """
    _keys.validate_service(service)
    if config is not None and not isinstance(config, Config):
        raise ConfigurationError(f"config must be an lbs.Config, got {type(config).__name__}")
    for name, value in (("letters", letters), ("sample", sample)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigurationError(f"{name} must be an integer >= 0, got {value!r}")
    client, owned = resolve_client(redis, cluster=cluster)
    try:
        return await _collect(client, service, config or Config(), letters, sample)
    except LbsError:
        raise
    except RedisError as exc:
        raise RedisOperationError("status", exc) from exc
    finally:
        if owned:
            await client.aclose()


async def _collect(
    client: aioredis.Redis | RedisCluster, service: str, config: Config, letters: int, sample: int
) -> ServiceStatus:
    if not isinstance(client, RedisCluster):
        return await _Reader(client, service, config, letters, sample, "").read()
    stream = _keys.input_stream(service)
    for attempt in range(3):
        node, name = await slot_owner(client, stream, refresh=attempt > 0)
        try:
            return await _Reader(node, service, config, letters, sample, name).read()
        except RedisOperationError as exc:
            if attempt == 2 or not redirected(exc.cause):
                raise
        except RedisError as exc:
            if attempt == 2 or not redirected(exc):
                raise
        finally:
            await node.aclose()
    raise AssertionError("unreachable")  # pragma: no cover


def _s(value: Any) -> str:
    """A reply value as text (bytes decoded as UTF-8, invalid bytes replaced); None as ""."""
    return "" if value is None else text(value, "replace")


def _int(value: str) -> int:
    """A counter of a key's state ("" or garbage: 0)."""
    return int(value) if value.isdigit() else 0


def _id_ms(entry_id: str) -> int:
    """The milliseconds part of a stream id."""
    return int(entry_id.partition("-")[0])


def _keyed(d: Any) -> dict[str, Any]:
    """A reply map with text keys (RESP2 and RESP3 replies, decoded or not)."""
    return {_s(k): v for k, v in dict(d).items()}


def _now_ms(reply: Any) -> int:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


@dataclass
class _First:
    """What round trip 1 read."""

    now: int
    version: str  # the Redis version it is compatible with (what behaviour checks go by)
    product: tuple[
        str, str
    ]  # ("Redis", "8.6.3"), ("Valkey", "9.0.1"); ("", "") when INFO is refused
    exists: bool
    length: int
    group: dict[str, Any] | None
    in_group: list[dict[str, Any]]
    pending: int
    oldest_pending: PendingEntry | None
    deadlines: dict[str, int]
    dead_letters: int
    newest_letters: list[Any]
    delayed: DelayedRetries | None
    names_waiting: int


@dataclass
class _Second:
    """What round trip 2 read."""

    now: int
    markers: dict[str, int | None]
    length: int = 0
    oldest_waiting: WaitingEntry | None = None
    newest_waiting: list[Any] = field(default_factory=list)
    #: The entries up to the last-delivered id (None when not read).
    delivered: list[Any] | None = None


class _Reader:
    """One status read on one plain client (the slot owner on a cluster)."""

    def __init__(
        self, r: aioredis.Redis, service: str, config: Config, letters: int, sample: int, node: str
    ) -> None:
        self.r, self.service, self.letters, self.sample, self.node = (
            r,
            service,
            letters,
            sample,
            node,
        )
        self.prefix = config.field_prefix
        self.stream = _keys.input_stream(service)
        self.group = _keys.group_name(service)
        dlq = config.dead_letter_stream
        self.dlq = _keys.dead_letter_stream(service) if dlq is None else dlq
        self.keys = {
            "stream": self.stream,
            "consumers": _keys.consumers_key(service),
            "delayed": _keys.delayed_stream(service),
            "due": _keys.due_key(service),
            "waiting": _keys.waiting_key(service),
        }
        if self.dlq:
            self.keys["dead letters"] = self.dlq

    @staticmethod
    def _check(what: str, reply: Any) -> Any:
        """A reply that must not be an error (the key types were checked first)."""
        if isinstance(reply, Exception):
            raise RedisOperationError(f"status ({what})", reply)
        return reply

    async def _exec(self, pipe: Any) -> list[Any]:
        try:
            return await pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]
        finally:
            await pipe.reset()

    async def read(self) -> ServiceStatus:
        first = await self._first()
        second = await self._second(first)
        status = self._assemble(first, second)
        if first.pending and self.sample:
            held, keys = await self._held(first.now)
            consumers = tuple(
                dataclasses.replace(c, held=held.get(c.name, ())) for c in status.consumers
            )
            status = dataclasses.replace(status, keys=keys, consumers=consumers)
        if first.names_waiting and self.sample:
            status = dataclasses.replace(status, waiting_names=await self._waiting_names())
        return status

    async def _waiting_names(self) -> tuple[NameWait, ...]:
        """Rounds 5 and 6: the first names of the waiting index (at most ``sample`` and
        :data:`WAITING_NAMES_SHOWN`), then, in one plain pipeline, each one's holder key and waiting
        list's length."""
        names = await waiting_names(self.r, self.service, min(self.sample, WAITING_NAMES_SHOWN))
        holder, listed = (
            _keys.name_holder(self.service, "").encode(),
            _keys.waiting_list(self.service, "").encode(),
        )
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.get(holder + name)
            pipe.llen(listed + name)
        replies = await self._exec(pipe)
        out = []
        for i, name in enumerate(names):
            value, waiting = replies[2 * i], replies[2 * i + 1]
            # A key of another type (garbage lbs leaves alone) shows as held by nobody, nothing waiting.
            value = "" if isinstance(value, Exception) or value is None else _s(value)
            back = value.startswith("+")
            out.append(
                NameWait(
                    text(name, "replace"),
                    value.strip("+"),
                    back,
                    0 if isinstance(waiting, Exception) else int(waiting),
                )
            )
        return tuple(out)

    async def _held(
        self, now: int
    ) -> tuple[dict[str, tuple[HeldStream, ...]], tuple[KeyStatus, ...]]:
        """Rounds 3 and 4 (plain pipelines): the first ``sample`` pending entries, their data streams'
        names and lock values (by consumer); then, for each, the key's state and data stream length. Keys
        without a state are left out (the service is not keyed, or the key was let go meanwhile)."""
        pending = self._check(
            "XPENDING range",
            await self.r.xpending_range(self.stream, self.group, "-", "+", self.sample),
        )
        held = [
            (
                _s(p.get("message_id")),
                _s(p.get("consumer")),
                int(p.get("time_since_delivered") or 0),
            )
            for p in map(_keyed, pending)
        ]
        pipe = self.r.pipeline(transaction=False)
        for entry_id, _, _ in held:
            pipe.xrange(self.stream, entry_id, entry_id, count=1)
            pipe.get(_keys.lock_key(self.service, entry_id))
        replies = await self._exec(pipe)
        names = []
        by_consumer: dict[str, list[HeldStream]] = {}
        for (entry_id, consumer, idle), entries, lock in zip(held, replies[::2], replies[1::2]):
            name = ""
            if not isinstance(entries, Exception) and entries:
                try:
                    name = decode_input(fields_text(entries[0][1]).get(_keys.INPUT_FIELD, ""))[0]
                    names.append((name, entry_id, consumer))
                except (LbsError, ValueError, AttributeError):
                    pass
            token, _, _ = (
                _s(lock).partition(":") if isinstance(lock, (bytes, str)) else ("", "", "")
            )
            by_consumer.setdefault(consumer, []).append(
                HeldStream(
                    name,
                    entry_id,
                    int(token) if token.isdigit() else None,
                    max(0, now - _id_ms(entry_id)),
                    idle,
                )
            )
        streams = {c: tuple(rows) for c, rows in by_consumer.items()}
        if not names:
            return streams, ()
        pipe = self.r.pipeline(transaction=False)
        for key, _, _ in names:
            pipe.hmget(
                _keys.key_state(self.service, key),
                "holder",
                "pos",
                "tries",
                "fails",
                "unblamed",
                "until",
            )
            pipe.xlen(_keys.keyed_stream(self.service, key))
        replies = await self._exec(pipe)
        rows = []
        for (key, entry_id, consumer), state, length in zip(names, replies[::2], replies[1::2]):
            if isinstance(state, Exception) or isinstance(length, Exception) or not any(state):
                continue
            holder, pos, tries, fails, unblamed, until = (_s(v) for v in state)
            failures = _int(fails) + _int(unblamed)
            rows.append(
                KeyStatus(
                    key,
                    consumer,
                    entry_id,
                    pos,
                    int(length),
                    _int(tries),
                    holder == entry_id,
                    failures,
                    bool(until) or _int(fails) > 0,
                )
            )
        return streams, tuple(sorted(rows, key=lambda k: (-k.backlog, k.key)))

    async def _first(self) -> _First:
        """Round trip 1, one MULTI/EXEC: a snapshot of everything that needs no earlier answer."""
        pipe = self.r.pipeline(transaction=True)
        pipe.time()
        pipe.info("server")
        roles = list(self.keys)
        for role in roles:
            pipe.type(self.keys[role])
        pipe.xlen(self.stream)
        pipe.xinfo_groups(self.stream)
        pipe.xinfo_consumers(self.stream, self.group)
        pipe.xpending(self.stream, self.group)
        pipe.xpending_range(self.stream, self.group, "-", "+", 1)
        pipe.zrange(self.keys["consumers"], 0, -1, withscores=True)
        if self.dlq:
            pipe.xlen(self.dlq)
            if self.letters:
                pipe.xrevrange(self.dlq, "+", "-", count=self.letters)
        pipe.xlen(self.keys["delayed"])
        pipe.zcard(self.keys["due"])
        pipe.zrange(self.keys["due"], 0, 0, withscores=True)
        pipe.zcard(self.keys["waiting"])
        it = iter(await self._exec(pipe))
        now = _now_ms(self._check("TIME", next(it)))
        info = next(it)
        # INFO may be refused (ACL). Valkey says so (and the Redis version it is compatible with).
        product = server_name(info) if isinstance(info, dict) else ("", "")
        version = _s(info.get("redis_version", "")) if isinstance(info, dict) else ""
        types = {role: _s(self._check("TYPE", next(it))) for role in roles}
        for role, kind in types.items():
            if kind not in ("none", _WANTED[role]):
                raise RedisOperationError(
                    "status",
                    ResponseError(f"LBSKEY {self.keys[role]} holds a {kind}, not {_ROLES[role]}"),
                )
        xlen, groups, consumers, summary, oldest, index = (next(it) for _ in range(6))
        dlq_len = next(it) if self.dlq else 0
        newest_letters = self._check("XREVRANGE", next(it)) if self.dlq and self.letters else []
        parked, scheduled, first_due = (self._check("delayed retries", next(it)) for _ in range(3))
        names_waiting = int(self._check("ZCARD", next(it)))

        exists = types["stream"] == "stream"
        group = next(
            (
                g
                for g in map(_keyed, self._check("XINFO GROUPS", groups) if exists else [])
                if _s(g.get("name")) == self.group
            ),
            None,
        )
        # Without a group, XINFO CONSUMERS and XPENDING answer NOGROUP: nothing delivered, nobody in it.
        in_group: list[dict[str, Any]] = []
        pending, oldest_pending = 0, None
        if group is not None:
            in_group = [_keyed(c) for c in self._check("XINFO CONSUMERS", consumers)]
            pending = int(_keyed(self._check("XPENDING", summary)).get("pending") or 0)
            head = self._check("XPENDING range", oldest)
            if head:
                p = _keyed(head[0])
                pid = _s(p.get("message_id"))
                oldest_pending = PendingEntry(
                    pid,
                    _s(p.get("consumer")),
                    max(0, now - _id_ms(pid)),
                    int(p.get("time_since_delivered") or 0),
                    int(p.get("times_delivered") or 0),
                )
        delayed = None
        if int(parked) or int(scheduled):
            delayed = DelayedRetries(
                self.keys["delayed"],
                int(parked),
                self.keys["due"],
                int(scheduled),
                int(float(first_due[0][1])) - now if first_due else None,
            )
        return _First(
            now,
            version,
            product,
            exists,
            int(self._check("XLEN", xlen)),
            group,
            in_group,
            pending,
            oldest_pending,
            {_s(m): int(float(score)) for m, score in self._check("ZRANGE", index)},
            int(self._check("XLEN", dlq_len)),
            newest_letters,
            delayed,
            names_waiting,
        )

    async def _second(self, first: _First) -> _Second:
        """Round trip 2, one MULTI/EXEC: the instance markers of the consumers round trip 1 named, and
        the entries around the group's last-delivered id."""
        names = sorted({_s(c.get("name")) for c in first.in_group} | set(first.deadlines))
        pipe = self.r.pipeline(transaction=True)
        pipe.time()
        for name in names:
            pipe.pttl(_keys.instance_key(self.service, name))
        group = first.group
        last_id = _s(group.get("last-delivered-id")) if group else ""
        after = "(" + last_id if group is not None else "-"
        # The waiting side is counted when it holds fewer than ``sample`` entries; otherwise the
        # delivered side (the pending entries, mostly), when it may be that small.
        count_delivered = (
            group is not None and self.sample > 0 and first.length - first.pending >= self.sample
        )
        if first.exists:
            pipe.xlen(self.stream)
            pipe.xrange(self.stream, after, "+", count=1)
            if self.sample:
                pipe.xrevrange(self.stream, "+", after, count=self.sample)
            if count_delivered:
                pipe.xrange(self.stream, "-", last_id, count=self.sample)
        it = iter(await self._exec(pipe))
        now = _now_ms(self._check("TIME", next(it)))
        markers: dict[str, int | None] = {}
        for name in names:
            ttl = int(self._check("PTTL", next(it)))
            markers[name] = None if ttl == -2 else ttl
        out = _Second(now, markers)
        if first.exists:
            out.length = int(self._check("XLEN", next(it)))
            head = self._check("XRANGE", next(it))
            if head:
                out.oldest_waiting = WaitingEntry(
                    _s(head[0][0]), max(0, now - _id_ms(_s(head[0][0])))
                )
            if self.sample:
                out.newest_waiting = self._check("XREVRANGE", next(it))
            if count_delivered:
                out.delivered = self._check("XRANGE", next(it))
        return out

    def _backlog(self, first: _First, second: _Second) -> tuple[int, bool, str]:
        """(backlog, exact, method): counted where that is cheap. Redis's lag goes wrong after deletions
        before 7.4 (redis/redis#13338), and is nil after most of lbs's own (a finished entry is deleted)."""
        waiting, delivered = second.newest_waiting, second.delivered
        if not first.exists:
            return 0, True, "none"
        if first.group is None:
            return first.length, True, "no group"
        if self.sample and len(waiting) < self.sample:
            return len(waiting), True, "counted"
        if delivered is not None and len(delivered) < self.sample:
            return max(0, second.length - len(delivered)), True, "counted"
        lag = first.group.get("lag")
        if lag is not None:
            return int(lag), parse_version(first.version) >= (7, 4), "lag"
        return max(0, first.length - first.pending, len(waiting)), False, "estimated"

    def _requeued(self, second: _Second, backlog: int, exact: bool) -> Requeued:
        """The re-queued copies among the newest waiting entries."""
        waiting = second.newest_waiting
        requeued = retried = replayed = 0
        for _id, raw in waiting:
            f = fields_text(raw)
            again = (self.prefix + "replayed_from") in f
            if again or (self.prefix + "original_id") in f:
                requeued += 1
                replayed += again
                try:
                    retried += int(f.get(self.prefix + "retry_count", "0")) > 0
                except ValueError:
                    pass
        complete = len(waiting) < self.sample or (exact and len(waiting) >= backlog)
        return Requeued(len(waiting), complete, requeued, retried, replayed)

    def _consumers(
        self, first: _First, second: _Second, notes: list[str]
    ) -> tuple[ConsumerStatus, ...]:
        """Every consumer of the group or of the deadline index; alive, late and dead ones first, most held
        first, then the departed by name."""
        now, deadlines, markers = first.now, first.deadlines, second.markers
        rows = []
        for c in first.in_group:
            name = _s(c.get("name"))
            inactive = c.get("inactive")  # Redis >= 7.2; -1: never
            rows.append(
                ConsumerStatus(
                    name,
                    True,
                    int(c.get("pending") or 0),
                    int(c.get("idle") or 0),
                    None if inactive is None or int(inactive) < 0 else int(inactive),
                    deadlines[name] - now if name in deadlines else None,
                    markers.get(name),
                )
            )
        for name in sorted(set(deadlines) - {c.name for c in rows}):
            notes.append(f"{name} is in the deadline index but not in the group")
            rows.append(
                ConsumerStatus(name, False, 0, None, None, deadlines[name] - now, markers.get(name))
            )
        order = {"dead": 0, "late": 1, "alive": 2, "departed": 3}
        rows.sort(
            key=lambda c: (
                c.state == "departed",
                -c.pending if c.state != "departed" else 0,
                order[c.state],
                c.name,
            )
        )
        return tuple(rows)

    def _assemble(self, first: _First, second: _Second) -> ServiceStatus:
        notes: list[str] = []
        consumers = self._consumers(first, second, notes)
        backlog, exact, method = self._backlog(first, second)
        reasons: Counter[str] = Counter(
            fields_text(fields).get(self.prefix + "reason", "")
            for _id, fields in first.newest_letters
        )
        return ServiceStatus(
            service=self.service,
            stream=self.stream,
            group=self.group,
            exists=first.exists,
            server_name=first.product[0] or "Redis",
            server_version=first.product[1] or first.version,
            node=self.node,
            time_ms=first.now,
            length=first.length,
            group_exists=first.group is not None,
            last_delivered_id=_s(first.group.get("last-delivered-id")) if first.group else "",
            backlog=backlog,
            backlog_exact=exact,
            backlog_method=method,
            oldest_waiting=second.oldest_waiting,
            pending=first.pending,
            oldest_pending=first.oldest_pending,
            consumers=consumers,
            requeued=self._requeued(second, backlog, exact),
            dead_letter_stream=self.dlq,
            dead_letters=first.dead_letters,
            reasons=tuple(ReasonCount(r, n) for r, n in reasons.most_common()),
            reasons_over=len(first.newest_letters),
            delayed=first.delayed,
            notes=tuple(notes),
            names_waiting=first.names_waiting,
        )
