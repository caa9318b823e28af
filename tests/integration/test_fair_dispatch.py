"""Fair dispatch (``Config.fair_dispatch``, :meth:`lbs._consumer.take.Taker.share`): while peers of the
group are live, a read takes no more than the reading consumer's share of the work, so a few long
registrations spread over idle consumers instead of going to the first that reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import lbs
from lbs._keys import group_name, input_stream

from _helpers import client, consumer_processes, eventually, group_has

pytestmark = pytest.mark.timeout(90)


async def register(r: aioredis.Redis, service: str, n: int) -> None:
    """``n`` registrations in one MULTI/EXEC: every blocked reader wakes to all of them at once."""
    async with r.pipeline(transaction=True) as pipe:
        for i in range(n):
            pipe.xadd(
                input_stream(service),
                {"lbs-input": json.dumps({"DataStreamName": f"long-{i}", "Info": {}})},
            )
        await pipe.execute()


async def test_long_registrations_spread_over_idle_consumers(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    release = asyncio.Event()
    running: Counter[str] = Counter()

    async def handler(note: lbs.Notification, who: str) -> None:
        running[who] += 1
        await release.wait()  # minutes of work, as far as dispatch can tell

    clients = [client(redis_server.url, service, f"c{i}") for i in range(3)]
    runs = [asyncio.create_task(c.run(lambda note, who=c.id: handler(note, who))) for c in clients]
    try:
        # Every consumer has read (and found nothing) before the work arrives: each is a live peer.
        await eventually(lambda: group_has(r, service, 3))
        await register(r, service, 12)
        await eventually(lambda: _is(sum(running.values()), 12))
        assert sorted(running.values()) == [4, 4, 4], running
        release.set()
        await eventually(lambda: _is(r.xlen(input_stream(service)), 0))
    finally:
        release.set()
        for c in clients:
            await c.close()
        for t in runs:
            await t


#: A consumer process: ``python -c CONSUMER URL SERVICE ID HANDLER_S``. Fair dispatch on (the default),
#: read_block 30 s; it prints a JSON line as each handler starts and closes when its stdin does.
CONSUMER = """
import asyncio, json, sys, time
import lbs

async def main(url, service, consumer, work):
    config = lbs.Config(read_block=30.0, drain_timeout=30.0)
    client = lbs.Client(url, service, consumer_id=consumer, config=config, load_entrypoint_plugins=False)

    async def handle(note):
        print(json.dumps({"id": note.entry_id, "at": time.time(), "who": consumer}), flush=True)
        await asyncio.sleep(work)

    run = asyncio.create_task(client.run(handle, handle_signals=False))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes it
    await client.close()
    await run

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
"""


async def trickle(
    url: str, service: str, consumers: int, handler_s: float, rate: float, n: int
) -> tuple[list[float], Counter[str]]:
    """``consumers`` consumer processes (fair dispatch on, ``read_block`` 30 s) under ``n``
    registrations at ``rate``/s, each handled for ``handler_s``: how long each waited (its handler's
    first start less its entry id's ms, in seconds) and how many each consumer started."""
    started: dict[str, float] = {}
    ran: Counter[str] = Counter()

    def seen(line: dict[str, Any]) -> None:
        started.setdefault(line["id"], line["at"])
        ran[line["who"]] += 1

    r = aioredis.Redis.from_url(url)
    try:
        async with consumer_processes(CONSUMER, url, service, consumers, seen, str(handler_s)):
            # Every consumer has read (and found nothing): each waits in a blocking read, a live
            # peer.
            await eventually(lambda: group_has(r, service, consumers), timeout=30)
            await asyncio.sleep(0.5)
            # From a thread of its own, as a producer elsewhere registers: not in step with the
            # consumers.
            await asyncio.to_thread(produce_steadily, url, service, rate, n)
            # A registration stalled behind fair dispatch waits for a read_block (30 s): give up
            # well before (the caller says what is missing).
            with contextlib.suppress(AssertionError):
                await eventually(lambda: _is(len(started), n), timeout=STALLED + handler_s)
    finally:
        await r.aclose()
    return [at - int(i.split("-")[0]) / 1000 for i, at in started.items()], ran


def produce_steadily(url: str, service: str, rate: float, n: int) -> None:
    """Register ``n`` data streams at ``rate`` a second, on a clock of their own."""
    r = redis.Redis.from_url(url)
    start = time.monotonic()
    try:
        for i in range(n):
            payload = json.dumps({"DataStreamName": f"trickle-{i}", "Info": {}})
            r.xadd(input_stream(service), {"lbs-input": payload})
            time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
    finally:
        r.close()


#: Far below read_block (30 s), far above a loaded machine's scheduling delays.
STALLED = 5.0


@pytest.mark.parametrize(("consumers", "rate"), [(2, 200), (4, 500)])
async def test_a_steady_stream_never_waits_for_read_block(
    redis_server: Any, service: str, consumers: int, rate: float
) -> None:
    # No-op handlers, registrations closer together than the finisher's linger: a consumer still
    # counts its finished entries as held, takes a share of 0 and leaves the next to an idle peer,
    # which nothing woke before read_block (the XADD had woken this consumer). Two seconds of it.
    n = int(2 * rate)
    waited, ran = await trickle(redis_server.url, service, consumers, 0.0, rate, n)
    assert len(waited) == n, f"{len(waited)} of {n} registrations started within {STALLED}s"
    assert max(waited) < STALLED, sorted(waited)[-5:]
    assert len(ran) == consumers, ran


async def test_long_handlers_under_a_trickle_spread_without_stalling(
    redis_server: Any, service: str
) -> None:
    # Handlers longer than the gap between registrations: fair dispatch spreads them, none waits.
    waited, ran = await trickle(redis_server.url, service, 2, 0.3, rate=20, n=60)
    assert len(waited) == 60, f"{len(waited)} of 60 registrations started within {STALLED}s"
    assert max(waited) < STALLED, sorted(waited)[-5:]
    assert len(ran) == 2 and min(ran.values()) > 0, ran


async def test_a_lone_consumer_takes_what_it_can(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    c = client(redis_server.url, service)
    async with holding(c) as held:
        await eventually(lambda: group_has(r, service, 1))
        await register(r, service, 12)
        await eventually(lambda: _is(held.running, 12))


async def test_the_share_counts_only_live_peers(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    # A peer that reads (XINFO idle within fair_window_ms) and holds nothing: half of the 9 waiting
    # is this consumer's, rounded up. Once the peer is quiet past the window it is no peer, and the
    # rest is this consumer's too.
    c = client(redis_server.url, service)
    async with live_peer(r, service) as keeper:
        await register(r, service, 9)
        async with holding(c) as held:
            await eventually(lambda: _is(held.running, 5))
            await asyncio.sleep(0.5)  # reads that would take more than the share: none does
            assert held.running == 5
            keeper.cancel()  # the peer goes quiet: past the window (5 s) it is no peer
            await eventually(lambda: _is(held.running, 9), timeout=60)


async def test_off_reads_up_to_count_whatever_the_peers(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    c = client(redis_server.url, service, fair_dispatch=False, read_count=50)
    async with live_peer(r, service):
        await register(r, service, 9)
        async with holding(c) as held:
            # All nine while the peer lives (with fair dispatch, five: test above).
            await eventually(lambda: _is(held.running, 9))


class Holding:
    """A handler that holds every stream it starts until :attr:`release` is set (minutes of work, as
    far as dispatch can tell), counting them in :attr:`running`."""

    def __init__(self) -> None:
        self.running = 0
        self.release = asyncio.Event()

    async def handler(self, note: lbs.Notification) -> None:
        self.running += 1
        await self.release.wait()


@contextlib.asynccontextmanager
async def holding(c: lbs.Client) -> AsyncIterator[Holding]:
    """``c`` running a :class:`Holding` handler for the block; after it, what the handler holds is
    released, ``c`` closed and its run awaited."""
    held = Holding()
    run = asyncio.create_task(c.run(held.handler))
    try:
        yield held
    finally:
        held.release.set()
        await c.close()
        await run


@contextlib.asynccontextmanager
async def live_peer(r: aioredis.Redis, service: str) -> AsyncIterator[asyncio.Task[None]]:
    """The group, and a consumer "peer" in it that holds nothing and reads every 0.1 s (an XREADGROUP
    of its own history: it delivers nothing) while the yielded task runs."""
    await r.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)

    async def keep() -> None:
        while True:
            await r.xreadgroup(group_name(service), "peer", {input_stream(service): "0"})
            await asyncio.sleep(0.1)

    await r.xgroup_createconsumer(input_stream(service), group_name(service), "peer")
    keeper = asyncio.create_task(keep())
    try:
        yield keeper
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper


async def _is(value: Any, expected: Any) -> bool:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        value = await value
    return bool(value == expected)
