"""Mixed fleets: lbs consumers beside the Go reference client v0.4, run as its protocol (``_goclient.py``).

Each test has a server of its own: the Go client rewrites ``notify-keyspace-events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from _lbscore import CommandBatch, encode_input
from lbs import _keys
from lbs._redis import scripts
from lbs._redis.scripts import DoneCode, RequeueCode
from lbs.config import GO_DONE_GAP
from lbs.embedded import (
    RedisServer,
    ServerNotFoundError,
    find_redis_server,
    server_product,
)
from lbs.testing import abandon

from _goclient import ConfigRefused, GoConsumer, GoStream, go_lock_key
from _helpers import command_calls, eventually, requeue_keys, requeue_switches

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(params=["redis8", "redis7", "valkey"])
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A Redis 8.x, then Debian's 7.0, then Valkey, with ``notify-keyspace-events`` empty, as Go wants
    to find it."""
    binary = None
    if (
        request.param == "valkey"
    ):  # skipped, or failed with LBS_REQUIRE_VALKEY=1, as valkey_server is
        binary = request.getfixturevalue("valkey_server").server.binary
    if request.param == "redis7":
        try:
            binary = find_redis_server(
                min_version=(7, 0), below_version=(8, 0), env_var="LBS_REDIS7_SERVER"
            )
        except ServerNotFoundError as exc:
            if os.environ.get("LBS_REQUIRE_REDIS7") == "1":
                pytest.fail(f"LBS_REQUIRE_REDIS7=1 but {exc}")
            pytest.skip(f"needs Debian's redis-server 7.x: {exc}")
    with RedisServer(binary, config={"notify-keyspace-events": ""}) as s:
        yield s


def _client(url: str, service: str, consumer: str, **config: Any) -> lbs.Client:
    cfg = dict(
        read_block=0.1, deadline_poll_interval=0.1, drain_timeout=0.0
    )  # handlers that wait for ever
    cfg.update(config)
    return lbs.Client(
        url, service, consumer_id=consumer, config=lbs.Config(**cfg), load_entrypoint_plugins=False
    )


async def test_go_refuses_lbs_keyspace_events_unless_forced_and_lbs_keeps_what_go_sets(
    server: RedisServer, service: str
) -> None:
    c = _client(server.url, service, "lbs-1")
    await c.start()  # adds K and x to an empty setting
    r = aioredis.Redis.from_url(server.url)
    try:
        assert set((await r.config_get("notify-keyspace-events"))["notify-keyspace-events"]) >= set(
            "Kx"
        )

        async def nothing(go: GoConsumer, s: GoStream) -> None:
            return None

        with pytest.raises(ConfigRefused):
            await GoConsumer(server.url, service, "go-1", nothing).start()
        go = GoConsumer(server.url, service, "go-1", nothing, force_config_override=True)
        await go.start()  # WithForceConfigOverride: exactly KEx
        go_set = (await r.config_get("notify-keyspace-events"))["notify-keyspace-events"]
        assert set(go_set) == set("KEx")
        await go.kill()
        await c.close()
        c = _client(server.url, service, "lbs-2")
        await c.start()  # KEx has what lbs needs: it changes nothing (lbs only ever adds flags)
        assert (await r.config_get("notify-keyspace-events"))["notify-keyspace-events"] == go_set
    finally:
        await c.close()
        await r.aclose()


async def test_a_group_go_created_at_dollar_is_reported_with_the_count_and_the_fix(
    server: RedisServer, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with lbs.Producer(server.url, service) as producer:
        await producer.add_streams([f"early-{i}" for i in range(5)])

    async def nothing(go: GoConsumer, s: GoStream) -> None:
        return None

    go = GoConsumer(server.url, service, "go-1", nothing, force_config_override=True)
    await go.start()  # XGROUP CREATE ... $: the five are behind the group
    await go.kill()
    caplog.set_level(logging.WARNING, logger="lbs")
    c = _client(server.url, service, "lbs-1")
    await c.start()
    warning = next(
        r.getMessage() for r in caplog.records if "will ever read them" in r.getMessage()
    )
    assert f"] 5 entries of {lbs.input_stream(service)}" in warning
    assert f"XGROUP SETID {lbs.input_stream(service)} {lbs.group_name(service)} 0" in warning
    await c.close()
    # The fix, as the warning gives it, with every consumer stopped: the five are delivered.
    r = aioredis.Redis.from_url(server.url)
    await r.xgroup_setid(lbs.input_stream(service), lbs.group_name(service), "0")
    await r.aclose()
    c = _client(server.url, service, "lbs-2")
    await c.start()
    seen = [(await c.next_notification()) for _ in range(5)]
    assert sorted(n.stream for n in seen if n is not None) == [f"early-{i}" for i in range(5)]
    await c.done_streams([n for n in seen if n is not None])
    await c.close()


async def test_normal_flow_two_go_and_two_lbs_consumers_process_each_stream_once(
    server: RedisServer, service: str
) -> None:
    names = [f"s{i}" for i in range(120)]
    runs: Counter[str] = Counter()
    by: Counter[str] = Counter()
    active: set[str] = set()
    overlaps: list[str] = []

    async def work(stream: str, who: str) -> None:
        if stream in active:
            overlaps.append(stream)
        active.add(stream)
        await asyncio.sleep(0.005)
        active.discard(stream)
        runs[stream] += 1
        by[who] += 1

    async def go_handler(go: GoConsumer, s: GoStream) -> None:
        await work(s.name, "go")

    async def lbs_handler(note: lbs.Notification) -> None:
        await work(note.stream, "lbs")

    lbs_clients = [_client(server.url, service, f"lbs-{i}") for i in range(2)]
    gos = [
        GoConsumer(server.url, service, f"go-{i}", go_handler, force_config_override=True)
        for i in range(2)
    ]
    runners = [
        asyncio.create_task(c.run(lbs_handler, concurrency=10)) for c in lbs_clients
    ]  # the group at 0
    try:
        async with lbs.Producer(server.url, service) as producer:
            # The first 40 go to lbs alone (Go's reader, one round trip and no COUNT, wins most races),
            # the rest to whoever reads first once the Go consumers run too.
            await producer.add_streams(names[:40])

            async def lbs_had_some() -> bool:
                return by["lbs"] > 0

            await eventually(lbs_had_some)
            for g in gos:
                await g.start()
            for at in range(40, len(names), 20):
                await producer.add_streams(names[at : at + 20])
                await asyncio.sleep(0.02)

        async def all_done() -> bool:
            return sum(runs.values()) >= len(names)

        await eventually(all_done, timeout=60)
    finally:
        for c in lbs_clients:
            await c.close()
        await asyncio.gather(*runners)
        for g in gos:
            await g.kill()
    assert runs == Counter(dict.fromkeys(names, 1)) and overlaps == []
    assert by["go"] > 0 and by["lbs"] > 0


async def _past_claim_grace(r: aioredis.Redis, service: str) -> bool:
    """The first pending entry has been idle past requeue-6's "just claimed" grace."""
    p = await r.xpending_range(lbs.input_stream(service), lbs.group_name(service), "-", "+", 1)
    return bool(p[0]["time_since_delivered"] > 1500)


async def _go_holding(
    server: RedisServer,
    service: str,
    names: list[str],
    release: asyncio.Event,
    hb_interval: float = 5.0,
) -> tuple[GoConsumer, list[str]]:
    """A Go consumer holding ``names`` (its handler waits for ``release``: slow, alive, its locks
    extended every ``hb_interval`` / 2); their LBS entry ids. The default, 5 s (``WithLBSHBInterval``),
    keeps a live holder's locks through event-loop stalls of a loaded machine (the double shares the
    test's loop); the Go default, 2 s, is for the tests that kill it."""

    async def slow(go: GoConsumer, s: GoStream) -> None:
        await release.wait()

    go = GoConsumer(
        server.url, service, "go-1", slow, hb_interval=hb_interval, force_config_override=True
    )
    await go.start()
    async with lbs.Producer(server.url, service) as producer:
        await producer.add_streams(names)

    async def holding() -> bool:
        return len(go.held) == len(names)

    await eventually(holding)
    return go, [go.held[n].entry_id for n in names]


@pytest.mark.parametrize("compatible", [False, True], ids=["default", "go-compatible"])
async def test_claim_takes_a_live_go_holders_entry_only_outside_go_compatible_mode(
    server: RedisServer, service: str, compatible: bool
) -> None:
    release = asyncio.Event()
    go, ids = await _go_holding(server, service, ["a", "b"], release)
    c = _client(server.url, service, "lbs-1", go_compatible=compatible, recovery=False)
    await c.start()
    try:
        # Pending to a Go consumer, which has no lease: only the Go-style lock shows the holder.
        assert [await c.claim(i) for i in ids] == [not compatible] * 2
    finally:
        release.set()
        await c.close()
        await go.kill()


async def test_go_compatible_recovery_never_robs_a_slow_live_go_holder(
    server: RedisServer, service: str
) -> None:
    """lbs consumers scanning every 0.3 s for entries idle past 1.2 s, beside a Go consumer that holds
    three streams for as long as it takes several such scans (Go never refreshes the idle time)."""
    release = asyncio.Event()
    go, _ids = await _go_holding(server, service, ["x", "y", "z"], release)
    r = aioredis.Redis.from_url(server.url)
    ran: list[str] = []

    async def handle(note: lbs.Notification) -> None:
        ran.append(note.stream)

    clients = [
        _client(
            server.url,
            service,
            f"lbs-{i}",
            go_compatible=True,
            lock_ttl=0.5,
            min_idle=1.2,
            reconciliation_interval=0.3,
        )
        for i in range(2)
    ]
    runners = [asyncio.create_task(c.run(handle)) for c in clients]
    try:

        async def scans() -> int:
            return (await command_calls(r)).get("xpending", 0)

        async def idle_enough() -> bool:
            assert ran == [], "lbs took a stream a live Go consumer holds"
            pending = await r.xpending_range(
                lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
            )
            return len(pending) == 3 and min(p["time_since_delivered"] for p in pending) > 1500

        await eventually(idle_enough, timeout=20)
        before = await scans()

        async def scanned_while_held() -> (
            bool
        ):  # each scan reads XPENDING; the requeue checks run with it
            return await scans() >= before + 6

        await eventually(scanned_while_held, timeout=30)
        assert ran == []  # nothing taken from Go
        release.set()
        await go.finished(
            3
        )  # its Done events (bounded at 60 s: a loaded machine's event loop stalls)
        assert sorted(go.processed()) == ["x", "y", "z"]
        assert ran == [] and await r.xlen(lbs.input_stream(service)) == 0
    finally:
        release.set()
        for c in clients:
            await c.close()
        await asyncio.gather(*runners)
        await go.kill()
        await r.aclose()


async def test_a_scan_between_a_go_done_streams_unlock_and_its_xack_re_queues_nothing(
    server: RedisServer, service: str
) -> None:
    """Go's ``DoneStream`` deletes its lock, then XACKs in a second round trip. A scan that finds the
    entry in between (here the Go process stalls 0.3 s there) must not re-run the finished stream."""
    async with _one_go_held_entry(server, service) as (go, entry_id, r, c):
        done = asyncio.create_task(go.done_stream("z", stall=0.3))

        async def unlocked() -> bool:
            return not await r.exists(go_lock_key("z", entry_id))

        await eventually(unlocked)
        counts = await c.recovery.scan(min_idle=0)
        await done
        await _nothing_rerun(counts, go, r, service)


async def test_a_scan_that_looked_before_a_go_done_streams_unlock_re_queues_nothing(
    server: RedisServer, service: str
) -> None:
    """The other order: the scan has found the entry's holder without a lease (as every Go holder is) when
    Go's ``DoneStream`` deletes its lock, then XACKs 0.6 ``GO_DONE_GAP`` later. The re-queue must not land
    between the two: the scan's gap counts from its look at the Go-style lock, not from its look at
    the lease (a scan that waited from the first look re-ran the finished stream: the rare failure of
    test_go_compatible_recovery_never_robs_a_slow_live_go_holder under load)."""
    async with _one_go_held_entry(server, service) as (go, _id, r, c):

        async def lock_looks() -> int:
            return (await command_calls(r)).get("exists", 0)

        before = await lock_looks()
        scan = asyncio.create_task(c.recovery.scan(min_idle=0))

        async def looked() -> bool:  # the scan has found the entry's holder without a lease
            return await lock_looks() > before

        await eventually(looked)
        await asyncio.sleep(GO_DONE_GAP / 2)  # Go finishes while the scan is on its way
        await go.done_stream("z", stall=0.6 * GO_DONE_GAP)
        counts = await asyncio.wait_for(scan, 30)
        await _nothing_rerun(counts, go, r, service)


@contextlib.asynccontextmanager
async def _one_go_held_entry(
    server: RedisServer, service: str
) -> AsyncIterator[tuple[GoConsumer, str, aioredis.Redis, lbs.Client]]:
    """A Go consumer holding stream "z" (slow, alive) past requeue-6's "just claimed" grace, and a
    started go-compatible lbs client with no recovery of its own (the test runs its scan)."""
    release = asyncio.Event()
    go, (entry_id,) = await _go_holding(server, service, ["z"], release)
    r = aioredis.Redis.from_url(server.url)
    c = _client(server.url, service, "lbs-1", go_compatible=True, recovery=False)
    await c.start()
    try:
        await eventually(lambda: _past_claim_grace(r, service))
        yield go, entry_id, r, c
    finally:
        release.set()
        await c.close()
        await go.kill()
        await r.aclose()


async def _nothing_rerun(
    counts: dict[str, int], go: GoConsumer, r: aioredis.Redis, service: str
) -> None:
    """The scan re-queued nothing: Go finished "z" once and the LBS is empty."""
    assert counts["requeued"] == 0 and go.processed() == ["z"]
    assert await r.xlen(lbs.input_stream(service)) == 0


async def _listening(c: lbs.Client) -> bool:
    return c.recovery.listening.is_set()


@pytest.mark.parametrize("compatible", [False, True], ids=["default", "go-compatible"])
async def test_a_dead_go_holders_streams_come_back_when_its_locks_expire(
    server: RedisServer, service: str, compatible: bool
) -> None:
    """kill -9 of a Go consumer holding three streams: with go_compatible the expiry of its 2-s locks
    brings them back (the keyspace listener); without it only the scan would, 30 s idle later."""
    release = asyncio.Event()
    go, _ids = await _go_holding(server, service, ["p", "q", "r"], release, hb_interval=2.0)
    got: dict[str, float] = {}
    seen = asyncio.Event()

    async def handle(note: lbs.Notification) -> None:
        got[note.stream] = time.monotonic()
        if len(got) == 3:
            seen.set()

    # The defaults' scan (min_idle 30 s, every 60 s) cannot be what brings them back within the wait.
    c = _client(server.url, service, "lbs-1", go_compatible=compatible)
    runner = asyncio.create_task(c.run(handle))
    try:
        await eventually(lambda: _listening(c))
        killed = time.monotonic()
        await go.kill()
        try:
            await asyncio.wait_for(
                seen.wait(), 10 if compatible else 4
            )  # (Go TTL 2 s: 4 s shows the difference)
        except asyncio.TimeoutError:
            pass
        if compatible:
            assert sorted(got) == ["p", "q", "r"]
            print(
                f"GO-RECOVERY dead Go holder -> lbs: {max(got.values()) - killed:.2f} s for 3 streams"
            )
        else:
            assert got == {}
    finally:
        await c.close()
        await runner


async def test_a_dead_go_holder_whose_expiries_lbs_missed_comes_back_when_its_listener_resubscribes(
    server: RedisServer, service: str
) -> None:
    """kill -9 of a Go holder while lbs's keyspace listener is down: the expired events are lost, and no
    deadline tells lbs the Go holder died. Resubscribing, the listener scans what is idle past Go's claim
    idle (2 s), lock-checked: the streams come back at once, not at the next periodic scan (30 s idle)."""
    release = asyncio.Event()
    go, ids = await _go_holding(server, service, ["p", "q", "r"], release, hb_interval=2.0)
    got: list[str] = []
    seen = asyncio.Event()

    async def handle(note: lbs.Notification) -> None:
        got.append(note.stream)
        if len(got) == 3:
            seen.set()

    # A listener that loses its connection waits 5-10 s before it subscribes again.
    c = _client(server.url, service, "lbs-1", go_compatible=True, read_retry_initial=10.0)
    r = aioredis.Redis.from_url(server.url)
    runner = asyncio.create_task(c.run(handle))
    try:
        await eventually(lambda: _listening(c))
        await go.kill()
        await r.client_kill_filter(_type="pubsub")

        async def expired() -> (
            bool
        ):  # EXISTS expires a lapsed lock on the spot: its event goes unheard
            return await r.exists(*(go_lock_key(n, i) for n, i in zip("pqr", ids))) == 0

        await eventually(expired)
        assert not c.recovery.listening.is_set() and got == []
        await asyncio.wait_for(seen.wait(), 30)
        assert sorted(got) == ["p", "q", "r"]
        assert c.metrics.get("keyspace_listener_reconnects_total") == 1
    finally:
        await c.close()
        await runner
        await r.aclose()


@pytest.mark.parametrize("compatible", [False, True], ids=["default", "go-compatible"])
async def test_a_go_consumer_starting_with_a_5s_idle_time_takes_live_lbs_work_only_by_default(
    server: RedisServer, service: str, compatible: bool
) -> None:
    """Go's start-up XAUTOCLAIM takes whatever is idle past WithLBSIdleTime, live holders included:
    with go_compatible lbs's heartbeat keeps its entries' idle time under 4 s."""
    release = asyncio.Event()
    took: list[str] = []

    async def slow(note: lbs.Notification) -> None:
        took.append(note.stream)
        await release.wait()

    c = _client(server.url, service, "lbs-1", go_compatible=compatible)
    runner = asyncio.create_task(c.run(slow))
    go: GoConsumer | None = None
    try:
        async with lbs.Producer(server.url, service) as producer:
            await producer.add_streams(["u", "v", "w"])

        async def holding() -> bool:
            return len(took) == 3

        await eventually(holding)
        await asyncio.sleep(
            6.0
        )  # past Go's 5 s idle time: only the heartbeat's refresh keeps them "fresh"

        async def nothing(go: GoConsumer, s: GoStream) -> None:
            return None

        go = GoConsumer(
            server.url, service, "go-1", nothing, lbs_idle_time=5.0, force_config_override=True
        )
        await go.start()
        stolen = [name for kind, name, _ in go.events if kind == "StreamAdded"]
        if compatible:
            assert stolen == []
        else:  # by default a tick refreshes a rotating quarter of the entries: most sat idle past 5 s
            assert stolen != [] and set(stolen) <= {"u", "v", "w"}
    finally:
        release.set()
        await c.close()
        await runner
        if go is not None:
            await go.kill()


async def test_running_go_consumers_recover_a_dead_lbs_consumers_streams(
    server: RedisServer, service: str
) -> None:
    """With go_compatible an lbs consumer holds a Go-style lock per stream (kept by its heartbeat for
    max(lock_ttl, 4 s)); when it dies those expire and the Go consumers' keyspace listener claims them."""
    release = asyncio.Event()
    mine: list[str] = []

    async def slow(note: lbs.Notification) -> None:
        mine.append(note.stream)
        await release.wait()

    r = aioredis.Redis.from_url(server.url)
    c = _client(server.url, service, "lbs-1", go_compatible=True, lock_ttl=1.0)
    runner = asyncio.create_task(c.run(slow))
    done_by_go: list[str] = []

    async def go_handler(go: GoConsumer, s: GoStream) -> None:
        done_by_go.append(s.name)

    go = GoConsumer(server.url, service, "go-1", go_handler, force_config_override=True)
    try:
        async with lbs.Producer(server.url, service) as producer:
            await producer.add_streams(["d", "e", "f"])

        async def go_style_locks() -> (
            bool
        ):  # taken by lbs, and a heartbeat tick set their Go-style locks
            if len(mine) < 3:
                return False
            ids = [h.entry_id for h in c.held_streams()]
            return (
                len(ids) == 3
                and await r.exists(
                    *(go_lock_key(n, i) for n, i in zip([h.stream for h in c.held_streams()], ids))
                )
                == 3
            )

        await eventually(go_style_locks)
        values = [await r.get(go_lock_key(h.stream, h.entry_id)) for h in c.held_streams()]
        assert values == [c.id.encode()] * 3  # the value a Go consumer writes: the holder's name
        await go.start()
        died = time.monotonic()
        await abandon(c)  # kill -9 of an lbs consumer, in-process: nothing released

        async def go_took_over() -> bool:
            return sorted(done_by_go) == ["d", "e", "f"]

        await eventually(go_took_over, timeout=20)
        print(f"GO-RECOVERY dead lbs consumer -> Go: {time.monotonic() - died:.2f} s for 3 streams")

        async def go_finished() -> bool:  # DoneStream: unlock, XACK, XDEL
            return (
                sorted(go.processed()) == ["d", "e", "f"]
                and await r.xlen(lbs.input_stream(service)) == 0
            )

        await eventually(go_finished)
    finally:
        release.set()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await c.close()
        await go.kill()
        await r.aclose()


async def test_a_stream_a_go_consumer_takes_from_a_live_lbs_holder_is_disowned_and_counted(
    server: RedisServer, service: str
) -> None:
    release = asyncio.Event()

    async def slow(note: lbs.Notification) -> None:
        await release.wait()

    r = aioredis.Redis.from_url(server.url)
    c = _client(server.url, service, "lbs-1", go_compatible=True, lock_ttl=1.0)
    runner = asyncio.create_task(c.run(slow))
    try:
        async with lbs.Producer(server.url, service) as producer:
            await producer.add_stream("g")

        async def held() -> bool:
            return len(c.held_streams()) == 1

        await eventually(held)
        (h,) = c.held_streams()
        # A Go consumer's Claim after a tick it missed: XCLAIM, then its lock, with its name.
        await r.xclaim(
            lbs.input_stream(service),
            lbs.group_name(service),
            "redis-consumer-go-1",
            0,
            [h.entry_id],
        )
        await r.set(go_lock_key(h.stream, h.entry_id), "redis-consumer-go-1", px=2000)

        async def disowned() -> bool:
            return c.metrics.get("go_taken_total", 0) == 1 and not c.held_streams()

        await eventually(disowned)
        beats = c.stats.heartbeats

        async def ticked() -> bool:
            return c.stats.heartbeats > beats

        await eventually(
            ticked
        )  # one more tick: the entry stays the Go consumer's, its lock untouched (or lapsed), ours lives
        assert await _owner(r, service, h.entry_id) == b"redis-consumer-go-1"
        assert await r.get(go_lock_key(h.stream, h.entry_id)) in (b"redis-consumer-go-1", None)
        assert await r.get(c.lease_key) == c.instance.encode()  # one stream lost, not the lease
    finally:
        release.set()
        await c.close()
        await runner
        await r.aclose()


@pytest.mark.skip(reason="issue 44: CLAIM reads are being redesigned for the lease")
@pytest.mark.parametrize("compatible", [False, True], ids=["default", "go-compatible"])
async def test_the_claim_reader_takes_a_live_go_holders_entries_only_by_default(
    server: RedisServer, service: str, compatible: bool
) -> None:
    """lbs-claim's XREADGROUP ... CLAIM hands over whatever is idle, and Go never refreshes idle times:
    with go_compatible the reader leaves a claimed entry whose Go-style lock exists to its Go holder."""
    lbs_claim = pytest.importorskip("lbs_claim")
    product, version = server_product(server.binary), ".".join(map(str, server.version))
    if server.version < (8, 4) or product == "Valkey":
        pytest.skip(f"XREADGROUP ... CLAIM needs Redis >= 8.4, not {product} {version}")
    release = asyncio.Event()
    go, _ids = await _go_holding(server, service, ["k1", "k2"], release)
    ran: list[str] = []

    async def handle(note: lbs.Notification) -> None:
        ran.append(note.stream)

    cfg = lbs.Config(
        read_block=0.1, lock_ttl=0.3, min_idle=1.0, go_compatible=compatible, recovery=False
    )
    c = lbs.Client(
        server.url,
        service,
        consumer_id="lbs-1",
        config=cfg,
        load_entrypoint_plugins=False,
        plugins=[lbs_claim.ClaimReader(min_idle=1.0)],
    )
    runner = asyncio.create_task(c.run(handle))
    r = aioredis.Redis.from_url(server.url)
    try:
        if not compatible:

            async def robbed() -> bool:
                return sorted(ran) == ["k1", "k2"]

            await eventually(robbed, timeout=20)
            return

        async def reads() -> int:
            return (await command_calls(r)).get("evalsha", 0)

        async def claimed_by_lbs() -> (
            bool
        ):  # CLAIM moved them to lbs's pending list; the read locked nothing
            pending = await r.xpending_range(
                lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
            )
            return len(pending) == 2 and {p["consumer"] for p in pending} == {c.id.encode()}

        await eventually(claimed_by_lbs, timeout=20)
        before = await reads()

        async def read_again() -> (
            bool
        ):  # reads with CLAIM, every 0.1 s, while the entries are claimable
            return await reads() >= before + 10

        await eventually(read_again, timeout=20)
        assert ran == []
        release.set()

        async def go_finished() -> bool:
            return sorted(go.processed()) == ["k1", "k2"]

        await eventually(go_finished)
        assert ran == []
    finally:
        release.set()
        await c.close()
        await runner
        await go.kill()
        await r.aclose()


async def test_go_style_locks_are_released_with_done_and_hand_back(
    server: RedisServer, service: str
) -> None:
    r = aioredis.Redis.from_url(server.url)
    c = _client(server.url, service, "lbs-1", go_compatible=True, lock_ttl=1.0)
    release = asyncio.Event()

    async def go_locks() -> int:
        return len([k async for k in r.scan_iter(match="*<MUTEX_KEY_SEP>*")])

    async def handle(note: lbs.Notification) -> None:
        if note.stream == "done-me":
            await release.wait()  # finished (done) once both Go-style locks exist
        else:
            await asyncio.Event().wait()  # held until close() hands it back

    runner = asyncio.create_task(c.run(handle))
    try:
        async with lbs.Producer(server.url, service) as producer:
            await producer.add_streams(["done-me", "hand-me"])

        async def both_locked() -> bool:
            return await go_locks() == 2

        await eventually(both_locked)
        release.set()

        async def one_left() -> bool:
            return c.stats.done == 1 and await go_locks() == 1

        await eventually(one_left)
    finally:
        await c.close()  # hands "hand-me" back
        await runner
    assert c.stats.handed_back == 1 and await go_locks() == 0
    await r.aclose()


async def test_a_stream_a_go_consumer_claimed_is_not_finished_as_done(
    server: RedisServer, service: str
) -> None:
    """Between two ticks a Go consumer XCLAIMs a live lbs stream; the lbs handler then returns: done-n
    finds the entry pending under the Go consumer, lets it go and acks nothing (TAKEN)."""
    release = asyncio.Event()

    async def handle(note: lbs.Notification) -> None:
        await release.wait()

    r = aioredis.Redis.from_url(server.url)
    c = _client(server.url, service, "lbs-1", go_compatible=True, heartbeat_interval=3.5)
    runner = asyncio.create_task(c.run(handle))
    try:
        async with lbs.Producer(server.url, service) as producer:
            await producer.add_stream("t")

        async def held() -> bool:
            return len(c.held_streams()) == 1

        await eventually(held)
        (h,) = c.held_streams()
        beats = c.stats.heartbeats

        async def ticked() -> (
            bool
        ):  # right after a tick: 3.5 s before the next one refreshes the entry
            return c.stats.heartbeats > beats

        await eventually(ticked, timeout=10)
        await r.xclaim(
            lbs.input_stream(service),
            lbs.group_name(service),
            "redis-consumer-go-1",
            0,
            [h.entry_id],
        )
        release.set()

        async def not_done() -> bool:
            return c.metrics.get("go_taken_total", 0) == 1 and c.stats.lock_lost == 1

        await eventually(not_done)
        assert c.stats.done == 0
        pending = await r.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
        )
        assert [(p["message_id"].decode(), p["consumer"]) for p in pending] == [
            (h.entry_id, b"redis-consumer-go-1")
        ]
        assert c.held_streams() == []  # lbs let it go
    finally:
        release.set()
        await c.close()
        await runner
        await r.aclose()


# -- the scripts beside a Go fleet: Go-style locks kept and released under lbs's lease, atomically ---------


@pytest.fixture
async def r(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A client of the test's server, closed whatever the test's outcome."""
    client = aioredis.Redis.from_url(server.url)
    yield client
    await client.aclose()


#: Consumer c1's lease value in the script tests: what is pending to c1 is c1's while its lease holds it.
LEASE = "n1"


async def _held_by_c1(r: aioredis.Redis, service: str, names: str) -> list[tuple[str, str]]:
    """One entry per data stream of ``names``, read by consumer c1, whose lease holds ``LEASE``: (entry id,
    its Go-style lock key) each."""
    lbs_key, group = lbs.input_stream(service), lbs.group_name(service)
    await r.xgroup_create(lbs_key, group, id="0", mkstream=True)
    for name in names:
        await r.xadd(lbs_key, {"lbs-input": f'{{"DataStreamName":"{name}","Info":{{}}}}'})
    ((_, entries),) = await r.xreadgroup(group, "c1", {lbs_key: ">"})
    await r.set(_keys.lease_key(service, "c1"), LEASE, px=60_000)
    return [
        (entry_id.decode(), go_lock_key(name, entry_id.decode()))
        for (entry_id, _), name in zip(entries, names)
    ]


def _command(b: CommandBatch, script: str) -> list[bytes | str]:
    """The one EVALSHA ``b`` holds, as an EVAL of ``script``'s source (no SCRIPT LOAD needed)."""
    parts = b.getvalue().split(b"\r\n")
    assert parts[0].startswith(b"*") and len(b) == 1
    args = [parts[i] for i in range(2, 2 * int(parts[0][1:]) + 1, 2)]
    assert args[0] == b"EVALSHA"
    return ["EVAL", scripts.source(script), *args[2:]]


async def _owner(r: aioredis.Redis, service: str, entry_id: str) -> bytes | None:
    p = await r.xpending_range(
        lbs.input_stream(service), lbs.group_name(service), entry_id, entry_id, 1
    )
    return p[0]["consumer"] if p else None


async def _pending(r: aioredis.Redis, service: str, entry_id: str) -> tuple[int, int]:
    """(idle ms, delivery count) of a pending entry."""
    (p,) = await r.xpending_range(
        lbs.input_stream(service), lbs.group_name(service), entry_id, entry_id, 1
    )
    return p["time_since_delivered"], p["times_delivered"]


async def test_done_beside_a_go_fleet_releases_our_go_style_locks_and_leaves_a_go_holders(
    r: aioredis.Redis, service: str
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    (ours, go_a), (taken, go_b), (claimed, go_c) = await _held_by_c1(r, service, "abc")
    await r.set(go_a, "c1", px=60_000)
    await r.set(go_b, "redis-consumer-go-1", px=60_000)  # a Go consumer took b while we held it
    # Our Go-style lock of c lapsed (a stall); a Go consumer claimed c and holds its Go-style lock.
    await r.xclaim(stream, group, "redis-consumer-go-1", 0, [claimed])
    await r.set(go_c, "redis-consumer-go-1", px=60_000)
    ids = [ours, taken, claimed]

    async def done(lease: str) -> list[int]:
        b = CommandBatch()
        scripts.done(
            b,
            stream,
            _keys.lease_key(service, "c1"),
            ids,
            list("abc"),
            group,
            "c1",
            lease,
            _keys.key_prefix(service),
            False,
            False,
            [go_a, go_b, go_c],
        )
        return scripts.done_codes(await r.execute_command(*_command(b, "done-n")))

    # Read under a lease that is no longer c1's (it lapsed, was taken again): nothing is ours, nothing written.
    assert await done("n0") == [DoneCode.LOCK_LOST] * 3
    assert await r.get(go_a) == b"c1" and await _owner(r, service, ours) == b"c1"
    assert await done(LEASE) == [DoneCode.DONE, DoneCode.TAKEN, DoneCode.TAKEN]
    assert not await r.exists(go_a)  # a: our Go-style lock released with the ack
    assert await _owner(r, service, ours) is None and await r.xrange(stream, ours, ours) == []
    assert await r.get(go_b) == await r.get(go_c) == b"redis-consumer-go-1"
    assert (
        await _owner(r, service, taken) == b"c1"
        and await _owner(r, service, claimed) == b"redis-consumer-go-1"
    )
    assert (
        await r.get(_keys.lease_key(service, "c1")) == LEASE.encode()
    )  # done never ends the lease


def _requeue(
    service: str,
    entry_id: str,
    mode: str,
    value: str = "",
    count_retry: bool = False,
    stream_name: str = "",
) -> list[bytes | str]:
    """One requeue-6 call of one entry beside a Go fleet (no retry delay, five retries, a dead-letter
    stream); its reply is a list of that one entry's."""
    b = CommandBatch()
    scripts.requeue(
        b,
        *requeue_keys(service),
        _keys.pardons_key(service),
        options=requeue_switches(service, "c1", go_lock_sep=_keys.GO_MUTEX_KEY_SEP),
        mode=mode,
        value=value,
        count_retry=count_retry,
        force_dead_letter=False,
        entries=[scripts.RequeueEntry(entry_id, stream_name=stream_name)],
    )
    return _command(b, "requeue-6")


async def test_hand_back_beside_a_go_fleet_releases_our_go_style_lock_and_refuses_a_go_holders(
    r: aioredis.Redis, service: str
) -> None:
    (ours, go_a), (taken, go_b) = await _held_by_c1(r, service, "ab")
    await r.set(go_a, "c1", px=60_000)
    await r.set(go_b, "redis-consumer-go-1", px=60_000)
    names = {ours: "a", taken: "b"}
    replies = [
        (
            await r.execute_command(
                *_requeue(service, i, "owned", value=LEASE, stream_name=names[i])
            )
        )[0]
        for i in (ours, taken)
    ]
    assert replies[0][0] == RequeueCode.REQUEUED and replies[1][:2] == [0, b"go lock"]
    assert not await r.exists(go_a)  # a: re-queued, our Go-style lock released with it
    assert await r.get(go_b) == b"redis-consumer-go-1" and await _owner(r, service, taken) == b"c1"
    assert (
        await r.get(_keys.lease_key(service, "c1")) == LEASE.encode()
    )  # a hand-back keeps the lease


async def test_recovery_beside_a_go_fleet_re_queues_what_a_go_holder_left_only_without_its_go_style_lock(
    r: aioredis.Redis, service: str
) -> None:
    """A Go consumer has no lease: recovery ("absent") takes what is pending to it unless its Go-style lock
    exists; what is pending to an lbs consumer waits for that consumer's lease to go."""
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    (alive, go_a), (dead, _), (lbs_held, _) = await _held_by_c1(r, service, "abc")
    await r.xclaim(
        stream, group, "redis-consumer-go-1", 0, [alive, dead], justid=True
    )  # as if Go read them
    await r.set(go_a, "redis-consumer-go-1", px=60_000)  # a live Go holder's; b's holder died

    async def recover(entry_id: str) -> list[Any]:
        (reply,) = await r.execute_command(*_requeue(service, entry_id, "absent", count_retry=True))
        return list(reply)

    assert (await recover(alive))[:2] == [0, b"go lock"]
    assert (await recover(lbs_held))[:2] == [0, b"lock"]  # c1's lease lives
    back = await recover(dead)
    assert back[0] == RequeueCode.REQUEUED and back[3] == 1  # the Go holder's death counted
    await r.delete(_keys.lease_key(service, "c1"))
    assert (await recover(lbs_held))[0] == RequeueCode.REQUEUED
    assert await _owner(r, service, alive) == b"redis-consumer-go-1"
    assert await _owner(r, service, dead) is None and await _owner(r, service, lbs_held) is None
    # a untouched; b and c re-queued, in that order
    names = [json.loads(f[b"lbs-input"])["DataStreamName"] for _, f in await r.xrange(stream)]
    assert names == list("abc")


async def test_the_heartbeat_keeps_go_style_locks_and_never_pulls_back_an_entry_a_go_consumer_took(
    r: aioredis.Redis, service: str
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    lease = _keys.lease_key(service, "c1")
    (fresh, go_a), (taken, go_b), (kept, go_c) = await _held_by_c1(r, service, "abc")
    await r.xclaim(stream, group, "redis-consumer-go-1", 0, [taken])
    await r.set(go_b, "redis-consumer-go-1", px=60_000)  # a Go consumer claimed b, then locked it
    await r.set(go_c, "c1", px=60_000)  # an earlier tick's; a was read since (no Go-style lock yet)
    await r.xclaim(stream, group, "c1", 0, [fresh, kept], idle=60_000, justid=True)

    async def tick() -> list[Any]:
        b = CommandBatch()
        scripts.extend(
            b,
            stream,
            _keys.consumers_key(service),
            lease,
            ttl_ms=10_000,
            group=group,
            consumer="c1",
            lease=LEASE,
            go=(4_000, [fresh, taken, kept], [go_a, go_b, go_c]),
        )
        return list(await r.execute_command(*_command(b, "extend-n")))

    await r.delete(lease)  # first the lease has lapsed: nothing is kept, refreshed or written
    assert await tick() == [b"LEASE "]
    assert await r.exists(lease, go_a, _keys.consumers_key(service)) == 0
    assert await r.pttl(go_c) > 4_000
    assert [(await _pending(r, service, i))[0] >= 60_000 for i in (fresh, kept)] == [True, True]
    await r.set(lease, LEASE, px=1_000)
    assert await tick() == [-2]  # b: a Go consumer took it
    assert 1_000 < await r.pttl(lease) <= 10_000  # the lease extended
    assert await r.zscore(_keys.consumers_key(service), "c1") is not None
    for go in (go_a, go_c):  # kept for the Go TTL, with our name
        assert await r.get(go) == b"c1" and 0 < await r.pttl(go) <= 4_000
    for i in (fresh, kept):  # XCLAIM JUSTID: idle time refreshed, delivery count untouched
        idle, delivered = await _pending(r, service, i)
        assert idle < 60_000 and delivered == 1 and await _owner(r, service, i) == b"c1"
    assert await r.get(go_b) == b"redis-consumer-go-1"
    assert await _owner(r, service, taken) == b"redis-consumer-go-1"  # not XCLAIMed back


#: Contested recoveries in the race test: streams of one dead Go holder that a live Go consumer
#: (its Claim) and an lbs consumer (the keyspace listener's re-queue) both go for at once.
CONTESTED = 2_000


async def test_go_claim_and_lbs_recovery_never_both_take_a_dead_holders_stream(
    server: RedisServer, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead Go holder's 2,000 locks expire together; a live Go consumer claims each (XCLAIM, then its
    lock one round trip later) while an lbs consumer re-queues each: every stream runs exactly once.
    Before requeue-6 checked the idle time with the re-queue, about 1 in 100 ran on both sides."""
    r = aioredis.Redis.from_url(server.url)
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    names = [f"c{i}" for i in range(CONTESTED)]
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    async with r.pipeline(transaction=False) as pipe:
        for n in names:
            pipe.xadd(stream, {"lbs-input": encode_input(n, {})})
        ids = [i.decode() for i in await pipe.execute()]
    dead = "redis-consumer-dead"
    assert len((await r.xreadgroup(group, dead, {stream: ">"}, count=CONTESTED))[0][1]) == CONTESTED
    runs: Counter[str] = Counter()
    caplog.set_level(logging.DEBUG, logger="lbs")

    async def go_handler(go: GoConsumer, s: GoStream) -> None:
        runs[s.name] += 1

    async def lbs_handler(note: lbs.Notification) -> None:
        runs[note.stream] += 1

    go = GoConsumer(
        server.url, service, "go-live", go_handler, hb_interval=1.0, force_config_override=True
    )
    c = _client(server.url, service, "lbs-1", go_compatible=True)
    await go.start()
    runner = asyncio.create_task(c.run(lbs_handler))
    try:
        await eventually(lambda: _listening(c))
        # The dead holder's Go-style locks, 1.5 s: past the live Go consumer's Claim idle time (1 s).
        async with r.pipeline(transaction=False) as pipe:
            for n, i in zip(names, ids):
                pipe.set(go_lock_key(n, i), dead, px=1500)
            await pipe.execute()

        async def all_ran() -> bool:
            return len(runs) == CONTESTED and await r.xlen(stream) == 0

        await eventually(all_ran, timeout=120, every=0.1)
    finally:
        await c.close()
        await runner
        await go.kill()
        await r.aclose()
    by_go = len(go.processed())
    twice = sorted(n for n, k in runs.items() if k > 1)
    # What lbs's re-queue found: just claimed by Go (left to it), already finished by Go, or its own.
    claimed = sum(1 for rec in caplog.records if "was just claimed" in rec.getMessage())
    finished = int(c.metrics.get("recovery_duplicate_ack_total", 0))
    print(
        f"GO-CLAIM-RACE {CONTESTED} contested recoveries: {by_go} by the Go consumer, {CONTESTED - by_go} by "
        f"lbs; lbs's re-queue found {claimed} just claimed, {finished} finished; {len(twice)} ran twice"
    )
    assert twice == [] and sum(runs.values()) == CONTESTED
    assert claimed > 0  # contested: lbs went for streams the Go consumer had just claimed
