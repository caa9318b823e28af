"""A test double of the Go reference client v0.4's *protocol* (handcoding-labs/redis-stream-client-go).

It sends the commands the Go client sends, with its key names, values and
timings, against a real Redis (``../shared/GO-CLIENT.md`` lists them): it is
the peer a mixed fleet runs beside, not a model of Redis. Only what Go does
in Redis is here; its application side is a handler the test passes.

* Start-up: ``CONFIG GET notify-keyspace-events`` (refused when set, unless
  ``force_config_override``), ``CONFIG SET notify-keyspace-events KEx``,
  ``PSUBSCRIBE __keyspace@0__:*<MUTEX_KEY_SEP>*``, ``XGROUP CREATE ... $
  MKSTREAM``, then ``XAUTOCLAIM`` of everything idle past ``lbs_idle_time``
  (no lock check), each claimed entry locked and started.
* Reading: ``XREADGROUP ... STREAMS <service>-input >`` with no COUNT, each
  entry locked (redsync: ``SET <name><MUTEX_KEY_SEP><id> <consumer> NX PX
  2000``) and started; the lock is extended every second by redsync's
  compare-and-PEXPIRE (``SET NX`` again when it has gone).
* An ``expired`` event of a Go-style lock key: ``StreamExpired``, and the
  application's ``Claim``: ``XCLAIM ... <hbInterval ms> <id>``, then lock.
* ``DoneStream``: redsync unlock (compare, DEL), ``XACK``, ``XDEL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

MUTEX_KEY_SEP = "<MUTEX_KEY_SEP>"

# redsync v4's scripts, as the Go client runs them.
_EXTEND = """
local val = redis.call("GET", KEYS[1])
if val == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
elseif val == false then
  return redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2], "NX")
else
  return 0
end
"""
_UNLOCK = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
else
  return 0
end
"""


def go_lock_key(stream: str, entry_id: str) -> str:
    """The Go client's lock key of one LBS entry."""
    return f"{stream}{MUTEX_KEY_SEP}{entry_id}"


class ConfigRefused(Exception):
    """Go refuses to start: notify-keyspace-events is set and no force override was given."""


@dataclass
class GoStream:
    """A stream the Go consumer holds (Go tracks them by data stream name)."""

    name: str
    entry_id: str
    lock_key: str
    started: float = field(default_factory=time.monotonic)
    extender: asyncio.Task[None] | None = None
    worker: asyncio.Task[None] | None = None


#: The application: ``await handler(consumer, stream)``; returning calls DoneStream.
GoHandler = Callable[["GoConsumer", GoStream], Awaitable[None]]


class GoConsumer:
    """One Go consumer process (``redis-consumer-<pod>``) of ``service``."""

    def __init__(
        self,
        url: str,
        service: str,
        pod: str,
        handler: GoHandler,
        *,
        hb_interval: float = 2.0,
        lbs_idle_time: float = 40.0,
        force_config_override: bool = False,
        claim_on_expiry: bool = True,
    ) -> None:
        self.url, self.service, self.handler = url, service, handler
        self.name = f"redis-consumer-{pod}"
        self.stream, self.group = f"{service}-input", f"{service}-group"
        self.hb_ms = int(hb_interval * 1000)
        self.lbs_idle_ms = int(lbs_idle_time * 1000)
        self.force_config_override = force_config_override
        self.claim_on_expiry = claim_on_expiry
        self.held: dict[str, GoStream] = {}
        #: ("StreamAdded" | "StreamExpired" | "Done" | "DoneFailed", stream name, entry id), in order.
        self.events: list[tuple[str, str, str]] = []
        self._redis = aioredis.Redis.from_url(url)
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[None]] = (
            set()
        )  # every stream's extender and worker, until they end
        self._pubsub: Any = None
        self._done = asyncio.Event()  # set at each Done
        self._extend = self._redis.register_script(_EXTEND)
        self._unlock = self._redis.register_script(_UNLOCK)

    # -- start-up ----------------------------------------------------------

    async def start(self) -> None:
        r = self._redis
        current = (await r.config_get("notify-keyspace-events")).get("notify-keyspace-events", "")
        if current and not self.force_config_override:
            await r.aclose()
            raise ConfigRefused("existing configuration detected without force override option")
        await r.config_set("notify-keyspace-events", "KEx")
        pubsub = self._pubsub = r.pubsub()
        await pubsub.psubscribe(f"__keyspace@0__:*{MUTEX_KEY_SEP}*")
        with contextlib.suppress(ResponseError):  # BUSYGROUP
            await r.xgroup_create(self.stream, self.group, id="$", mkstream=True)
        cursor = "0-0"
        while True:
            reply = await r.xautoclaim(
                self.stream, self.group, self.name, self.lbs_idle_ms, cursor, count=1000
            )
            cursor = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
            for entry_id, fields in reply[1]:
                await self._take(entry_id.decode(), fields)
            if cursor == "0-0":
                break
        self._tasks.append(asyncio.create_task(self._listen(pubsub)))
        self._tasks.append(asyncio.create_task(self._read()))

    # -- running -----------------------------------------------------------

    async def _read(self) -> None:
        reader = aioredis.Redis.from_url(self.url)
        try:
            while True:
                reply = await reader.xreadgroup(self.group, self.name, {self.stream: ">"}, block=0)
                for _, entries in reply or ():
                    for entry_id, fields in entries:
                        await self._take(entry_id.decode(), fields)
        finally:
            await reader.aclose()

    async def _take(self, entry_id: str, fields: dict[bytes, bytes] | None) -> None:
        if not fields or b"lbs-input" not in fields:
            return
        name = json.loads(fields[b"lbs-input"])["DataStreamName"]
        key = go_lock_key(name, entry_id)
        if not await self._redis.set(key, self.name, nx=True, px=self.hb_ms):
            return  # redsync: the lock is taken; Go logs and moves on
        s = GoStream(name, entry_id, key)
        self.held[name] = s
        s.extender = self._spawn(self._keep(s))
        self.events.append(("StreamAdded", name, entry_id))
        s.worker = self._spawn(self._work(s))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        return task

    async def _keep(self, s: GoStream) -> None:
        while True:
            await asyncio.sleep(self.hb_ms / 2000)
            await self._extend(keys=[s.lock_key], args=[self.name, self.hb_ms])

    async def _work(self, s: GoStream) -> None:
        await self.handler(self, s)
        await self.done_stream(s.name)

    async def _listen(self, pubsub: Any) -> None:
        async for message in pubsub.listen():
            if message.get("type") != "pmessage" or message.get("data") != b"expired":
                continue
            key = message["channel"].decode().split(":", 1)[1]
            name, _, entry_id = key.rpartition(MUTEX_KEY_SEP)
            self.events.append(("StreamExpired", name, entry_id))
            if self.claim_on_expiry:
                await self.claim(name, entry_id)

    async def claim(self, name: str, entry_id: str) -> bool:
        """The application's ``Claim`` after ``StreamExpired``: XCLAIM at hbInterval idle, then lock."""
        claimed = await self._redis.xclaim(
            self.stream, self.group, self.name, self.hb_ms, [entry_id]
        )
        for cid, fields in claimed:
            await self._take(cid.decode(), fields)
        return bool(claimed)

    async def done_stream(self, name: str, stall: float = 0.0) -> None:
        """``DoneStream``; ``stall``: the process pauses that long between its unlock and its XACK."""
        s = self.held.pop(name, None)
        if s is None:
            self.events.append(("DoneFailed", name, ""))  # "data stream not found"
            return
        if s.extender is not None:
            s.extender.cancel()
        await self._unlock(keys=[s.lock_key], args=[self.name])
        if stall:
            await asyncio.sleep(stall)
        await self._redis.xack(self.stream, self.group, s.entry_id)
        await self._redis.xdel(self.stream, s.entry_id)
        self.events.append(("Done", name, s.entry_id))
        self._done.set()

    # -- ending --------------------------------------------------------------

    async def kill(self) -> None:
        """kill -9: every task stops where it is; nothing is released (locks expire, entries stay pending)."""
        tasks = [*self._tasks, *self._spawned]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        if self._pubsub is not None:
            await self._pubsub.aclose()
        await self._redis.aclose()

    async def finished(self, n: int, timeout: float = 60.0) -> None:
        """Wait (on its Done events, never polling a clock) until ``n`` streams are done; bounded."""

        async def done() -> None:
            while len(self.processed()) < n:
                self._done.clear()
                await self._done.wait()

        await asyncio.wait_for(done(), timeout)

    def processed(self) -> list[str]:
        return [name for kind, name, _ in self.events if kind == "Done"]
