"""Reading a service's status: round trips 1 and 2 (each one MULTI/EXEC), then rounds 3 to 6
(:mod:`lbs.status.held`) when something is held or waits; on a cluster, on the slot's master."""

from __future__ import annotations

import dataclasses
import math
from contextlib import AsyncExitStack
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from .. import _keys
from .._admin import on_owner, time_ms
from .._redis.connection import (
    ClusterMode,
    RedisLike,
    execute,
    redirected,
    resolve_client,
    server_name,
)
from .._redis.errors import KeyTypeError
from .._streamids import id_ms
from ..config import Config
from ..exceptions import ConfigurationError, LbsError, RedisOperationError
from .held import holdings, names_waiting
from .records import DelayedRetries, Pause, PendingEntry, ServiceStatus, WaitingEntry
from .snapshot import First, Second, Target, assemble, check, keyed, s

__all__ = ["collect_status"]

#: What each of a service's keys must be (besides absent), and what it is, for the error.
ROLES = {
    "stream": "the load-balancer stream",
    "dead letters": "the dead-letter stream",
    "consumers": "the consumer deadline index",
    "delayed": "the parking stream of delayed retries",
    "due": "the due index of delayed retries",
    "waiting": "the waiting index of held names",
}
WANTED = {
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
        async with AsyncExitStack() as stack:
            node, name = await stack.enter_async_context(
                on_owner(client, stream, refresh=attempt > 0)
            )
            try:
                return await _Reader(node, service, config, letters, sample, name).read()
            except RedisOperationError as exc:
                if attempt == 2 or not redirected(exc.cause):
                    raise
            except RedisError as exc:
                if attempt == 2 or not redirected(exc):
                    raise
    raise AssertionError("unreachable")  # pragma: no cover


class _Reader(Target):
    """One status read on one plain client (the slot owner on a cluster)."""

    def __init__(
        self, r: aioredis.Redis, service: str, config: Config, letters: int, sample: int, node: str
    ) -> None:
        super().__init__(service, config, letters, sample, node)
        self.r = r

    async def read(self) -> ServiceStatus:
        first = await self._first()
        second = await self._second(first)
        status = assemble(self, first, second)
        if first.pending and self.sample:
            held, keys = await holdings(self.r, self, first.now)
            consumers = tuple(
                dataclasses.replace(c, held=held.get(c.name, ())) for c in status.consumers
            )
            status = dataclasses.replace(status, keys=keys, consumers=consumers)
        if first.names_waiting and self.sample:
            status = dataclasses.replace(status, waiting_names=await names_waiting(self.r, self))
        return status

    async def _first(self) -> First:
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
        pipe.hgetall(_keys.paused_key(self.service))
        it = iter(await execute(pipe, raise_on_error=False))
        now = time_ms(check("TIME", next(it)))
        info = next(it)
        # INFO may be refused (ACL). Valkey says so (and the Redis version it is compatible with).
        product = server_name(info) if isinstance(info, dict) else ("", "")
        version = s(info.get("redis_version", "")) if isinstance(info, dict) else ""
        types = {role: s(check("TYPE", next(it))) for role in roles}
        for role, kind in types.items():
            if kind not in ("none", WANTED[role]):
                raise RedisOperationError(
                    "status",
                    KeyTypeError(f"LBSKEY {self.keys[role]} holds a {kind}, not {ROLES[role]}"),
                )
        xlen, groups, consumers, summary, oldest, index = (next(it) for _ in range(6))
        dlq_len = next(it) if self.dlq else 0
        newest_letters = check("XREVRANGE", next(it)) if self.dlq and self.letters else []
        parked, scheduled, first_due = (check("delayed retries", next(it)) for _ in range(3))
        names_waiting = int(check("ZCARD", next(it)))
        paused = pause_of(next(it), now)

        exists = types["stream"] == "stream"
        group = next(
            (
                g
                for g in map(keyed, check("XINFO GROUPS", groups) if exists else [])
                if s(g.get("name")) == self.group
            ),
            None,
        )
        # Without a group, XINFO CONSUMERS and XPENDING answer NOGROUP: nothing delivered, nobody in it.
        in_group: list[dict[str, Any]] = []
        pending, oldest_pending = 0, None
        if group is not None:
            in_group = [keyed(c) for c in check("XINFO CONSUMERS", consumers)]
            pending = int(keyed(check("XPENDING", summary)).get("pending") or 0)
            head = check("XPENDING range", oldest)
            if head:
                p = keyed(head[0])
                pid = s(p.get("message_id"))
                oldest_pending = PendingEntry(
                    pid,
                    s(p.get("consumer")),
                    max(0, now - id_ms(pid)),
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
                _due_in(first_due, now),
            )
        return First(
            now,
            version,
            product,
            exists,
            int(check("XLEN", xlen)),
            group,
            in_group,
            pending,
            oldest_pending,
            {s(m): int(float(score)) for m, score in check("ZRANGE", index)},
            int(check("XLEN", dlq_len)),
            newest_letters,
            delayed,
            names_waiting,
            paused,
        )

    async def _second(self, first: First) -> Second:
        """Round trip 2, one MULTI/EXEC: the leases of the consumers round trip 1 named, and
        the entries around the group's last-delivered id."""
        names = sorted({s(c.get("name")) for c in first.in_group} | set(first.deadlines))
        pipe = self.r.pipeline(transaction=True)
        pipe.time()
        for name in names:
            pipe.pttl(_keys.lease_key(self.service, name))
        group = first.group
        last_id = s(group.get("last-delivered-id")) if group else ""
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
        it = iter(await execute(pipe, raise_on_error=False))
        now = time_ms(check("TIME", next(it)))
        markers: dict[str, int | None] = {}
        for name in names:
            ttl = int(check("PTTL", next(it)))
            markers[name] = None if ttl == -2 else ttl
        out = Second(now, markers)
        if first.exists:
            out.length = int(check("XLEN", next(it)))
            head = check("XRANGE", next(it))
            if head:
                out.oldest_waiting = WaitingEntry(s(head[0][0]), max(0, now - id_ms(s(head[0][0]))))
            if self.sample:
                out.newest_waiting = check("XREVRANGE", next(it))
            if count_delivered:
                out.delivered = check("XRANGE", next(it))
        return out


def pause_of(reply: Any, now: int) -> Pause | None:
    """The pause key's ``HGETALL`` as a :class:`Pause` (a key of another type is a pause too: the
    consumers take nothing while it exists)."""
    if isinstance(reply, Exception):
        return Pause("?", f"the pause key is not a hash ({reply}): lbs resume deletes it", 0, 0)
    if not reply:
        return None
    f = {s(k): s(v) for k, v in reply.items()}
    since = int(f["since_ms"]) if f.get("since_ms", "").isdigit() else 0
    return Pause(f.get("by", "?"), f.get("reason", ""), since, max(0, now - since) if since else 0)


def _due_in(first: Any, now: int) -> int | None:
    """Ms until the earliest parked entry is due (``ZRANGE ... 0 0 WITHSCORES``); None when nothing is
    parked or the earliest is never due (scored +inf: an entry promote-4.lua could not move)."""
    if not first:
        return None
    score = float(first[0][1])
    return int(score) - now if math.isfinite(score) else None
