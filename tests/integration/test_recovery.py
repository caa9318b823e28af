"""Recovery against real Redis, with consumers as separate processes that die for real."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._keys import GO_MUTEX_KEY_SEP, consumers_key, reaped_key
from lbs.testing import probe

from _helpers import client, eventually, next_line, produce, take

pytestmark = pytest.mark.timeout(180)

WORKER = str(Path(__file__).with_name("_worker.py"))


def spawn(
    url: str,
    service: str,
    consumer: str,
    ttl: float,
    work: float = 3600.0,
    flags: str = "",
    quiet: bool = False,
) -> subprocess.Popen[str]:
    """A worker process; ``quiet`` when nobody reads its lines (a full pipe would stall it)."""
    return subprocess.Popen(
        [sys.executable, WORKER, url, service, consumer, str(ttl), str(work), flags],
        stdout=subprocess.DEVNULL if quiet else subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


async def lbs_entries(r: aioredis.Redis, service: str) -> list[dict[bytes, bytes]]:
    return [f for _, f in await r.xrange(lbs.input_stream(service))]


@pytest.fixture
def rr(r: aioredis.Redis) -> aioredis.Redis:
    """Recovery is timed on Redis 8.x alone: ``rr`` here is the root conftest's ``r``
    (on ``redis_server``), not the integration conftest's 8.x-then-7.0 client."""
    return r


@pytest.fixture
async def volatile_keys(rr: aioredis.Redis, service: str) -> Any:
    """10,000 unrelated keys with TTLs: what makes Redis's expired events late."""
    keys = [f"noise:{service}:{i}" for i in range(10_000)]
    pipe = rr.pipeline(transaction=False)
    for k in keys:
        pipe.set(k, "x", ex=3600)
    await pipe.execute()
    yield keys
    for i in range(0, len(keys), 5000):
        await rr.unlink(*keys[i : i + 5000])


async def _kill_and_time_recovery(
    redis_server: Any, rr: aioredis.Redis, service: str, ttl: float, **recoverer: Any
) -> float:
    """Kill -9 a holder mid-stream; seconds until its stream is back in the LBS."""
    await produce(redis_server.url, service, "victim")
    proc = spawn(redis_server.url, service, "doomed", ttl, flags="norecovery")
    rec = client(redis_server.url, service, "rescuer", lock_ttl=ttl, **recoverer)
    try:
        held = await next_line(proc)
        assert held["stream"] == "victim"
        await rec.start()
        proc.kill()
        killed = time.monotonic()
        (note,) = await take(rec, 1, timeout=ttl + 10, kind=lbs.NotificationType.STREAM_ADDED)
        elapsed = time.monotonic() - killed
        assert note.stream == "victim" and note.retry_count == 1
        return elapsed
    finally:
        stop(proc)
        await rec.close()


async def test_kill_9_is_recovered_within_ttl_plus_1s_among_10k_volatile_keys(
    redis_server: Any, rr: aioredis.Redis, service: str, volatile_keys: list[str]
) -> None:
    ttl = 1.0
    elapsed = await _kill_and_time_recovery(
        redis_server, rr, service, ttl, deadline_poll_interval=0.1
    )
    assert elapsed <= ttl + 1.0, f"recovered after {elapsed:.2f}s"


async def test_kill_9_is_recovered_with_keyspace_events_disabled(
    redis_server: Any, rr: aioredis.Redis, service: str, volatile_keys: list[str]
) -> None:
    ttl = 1.0
    await rr.config_set("notify-keyspace-events", "")
    try:
        elapsed = await _kill_and_time_recovery(
            redis_server,
            rr,
            service,
            ttl,
            deadline_poll_interval=0.1,
            configure_keyspace_events=False,
            keyspace_recovery=False,
        )
    finally:
        await rr.config_set("notify-keyspace-events", "Kx")
    assert elapsed <= ttl + 1.0, f"recovered after {elapsed:.2f}s"


async def test_keyspace_path_alone_recovers(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    # The deadline poller effectively off: only the expired event can do it.
    ttl = 1.0
    elapsed = await _kill_and_time_recovery(
        redis_server, rr, service, ttl, deadline_poll_interval=3600.0
    )
    assert elapsed < ttl + 10


async def test_restart_under_the_same_id_recovers_its_own_pending_work(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    ttl = 0.5
    await produce(redis_server.url, service, "mine")
    proc = spawn(redis_server.url, service, "pod-0", ttl, flags="norecovery")
    try:
        await next_line(proc)
    finally:
        stop(proc)
    # Same id, every fast path off: only startup recovery can bring it back.
    again = client(
        redis_server.url,
        service,
        "pod-0",
        lock_ttl=ttl,
        keyspace_recovery=False,
        deadline_poll_interval=3600.0,
        reconciliation_interval=3600.0,
    )

    async def expired() -> bool:
        return await rr.exists(again.lease_key) == 0  # the killed process's lease lapsed

    await eventually(expired, timeout=10)
    await again.start()
    try:
        assert again.metrics.get("recovery_startup_requeued_total") == 1
        (note,) = await take(again, 1)
        assert note.stream == "mine" and note.retry_count == 1
    finally:
        await again.close()


async def test_a_slow_holder_with_a_live_lease_is_never_robbed(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    # A holder that keeps its lease alive (its heartbeat never refreshes the
    # pending idle time): its entry looks idle for longer than min_idle.
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await rr.xgroup_create(stream, group, id="0", mkstream=True)
    await produce(redis_server.url, service, "slow")
    reply = await rr.xreadgroup(group, "redis-consumer-go-slow", {stream: ">"}, count=1)
    entry_id = (
        next(iter(reply.values()))[0][0][0].decode()
        if isinstance(reply, dict)
        else reply[0][1][0][0].decode()
    )
    lease = lbs.lease_key(service, "redis-consumer-go-slow")
    await rr.set(lease, "nonce-of-go-slow", px=60_000)
    await asyncio.sleep(0.7)  # idle past min_idle (0.5 s below); time is the subject here
    rec = client(redis_server.url, service, "rescuer", lock_ttl=0.2, min_idle=0.5)
    await rec.start()
    try:
        result = await rec.recovery.scan()
        assert result == {"requeued": 0, "alive": 1, "pending": 1}
        assert await rec.claim(entry_id) is False
        assert await rr.get(lease) == b"nonce-of-go-slow"
        assert (await rr.xpending(stream, group))["pending"] == 1
    finally:
        await rec.close()


async def test_a_live_consumer_puts_back_what_it_held_when_its_lease_is_lost(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    # A lease deleted under a live holder (eviction, an operator's DEL): the
    # holder's deadline stays fresh, so no poller comes for it; its own
    # heartbeat finds the lease gone, disowns every stream, takes the lease
    # again and re-queues them, no retry counted.
    await produce(redis_server.url, service, "evicted", "kept")
    c = client(redis_server.url, service, "holder", recovery=False, max_streams=2)
    rec = client(redis_server.url, service, "rescuer", recovery=False)
    await c.start()
    try:
        notes = {n.stream: n for n in await take(c, 2)}
        await rr.delete(c.lease_key)
        assert await rec.recovery.poll_deadlines() == 0  # its deadline is not due
        assert await c.heartbeat() == 2
        disowned = await take(c, 2, kind=lbs.NotificationType.STREAM_DISOWNED)
        assert {n.stream for n in disowned} == {"evicted", "kept"}
        # Taken again, under a value of its own: a write built under the lapsed one is refused.
        assert await rr.get(c.lease_key) == f"{c.instance}.2".encode()
        again = {n.stream: n for n in await take(c, 2)}  # back in circulation, and read again
        assert set(again) == {"evicted", "kept"}
        for name, note in again.items():
            assert note.retry_count == 0 and note.entry_id != notes[name].entry_id
        assert {h.stream for h in c.held_streams()} == {"evicted", "kept"}
    finally:
        await c.close()
        await rec.close()


async def test_after_a_stall_the_deadline_poller_gives_a_grace_instead_of_judging(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    # A stopped server (SIGSTOP, a VM pause) lets every lease and deadline lapse
    # at once, though the holders live. The first poll after the gap gives each
    # overdue consumer one lease TTL of grace; without a gap it judges at once.
    index = consumers_key(service)
    await produce(redis_server.url, service, "a")
    c = client(redis_server.url, service, "stalled", recovery=False, lock_ttl=30)
    rec = client(redis_server.url, service, "rescuer", recovery=False, lock_ttl=2.0)
    await c.start()
    try:
        await take(c, 1)
        await rr.delete(c.lease_key)  # the lease lapsed ...
        await rr.zadd(index, {c.id: 0})  # ... and so did the deadline
        sec, usec = await rr.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        await rr.set(reaped_key(service), now_ms - 60_000)  # the last poll: a minute ago
        assert await rec.recovery.poll_deadlines() == 0
        assert await rr.zscore(index, c.id) > now_ms  # a grace, on the server's clock
        await rr.zadd(index, {c.id: 0})  # overdue again, and the last poll was just now
        assert await rec.recovery.poll_deadlines() == 1
    finally:
        await c.close()
        await rec.close()


async def test_the_deadline_poller_spares_a_late_live_consumer_and_times_its_next_look(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    # A consumer whose deadline passed (a late heartbeat) but whose lease
    # lives: the poller takes nothing, and looks again when its lease could
    # expire. The lease gone: everything pending to it comes back. Nothing
    # pending: the consumer leaves the index.
    index, stream, group = (
        consumers_key(service),
        lbs.input_stream(service),
        lbs.group_name(service),
    )
    await produce(redis_server.url, service, "a", "b", "c")
    c = client(redis_server.url, service, "late", recovery=False, max_streams=3, lock_ttl=30)
    rec = client(redis_server.url, service, "rescuer", recovery=False)
    await c.start()
    try:
        notes = {n.stream: n for n in await take(c, 3)}
        await rr.zadd(index, {c.id: 0})
        assert await rec.recovery.poll_deadlines() == 0
        # Read at once: the score and the lease's expiry, both absolute server times.
        pipe = rr.pipeline(transaction=True)
        pipe.zscore(index, c.id)
        pipe.pexpiretime(c.lease_key)
        score, expiry = await pipe.execute()
        assert score is not None and expiry > 0 and abs(score - expiry) < 1000

        await rr.delete(c.lease_key)
        await rr.zadd(index, {c.id: 0})
        assert await rec.recovery.poll_deadlines() == 3
        pending = await rr.xpending_range(stream, group, "-", "+", 10)
        assert not [p for p in pending if p["consumer"] == c.id.encode()]
        originals = {
            f[b"_original_id"].decode() for _, f in await rr.xrange(stream) if b"_original_id" in f
        }
        # Each one once, re-queued as a fresh entry under a new id (none taken over under its own).
        assert originals == {n.entry_id for n in notes.values()}
        assert not pending

        # Nothing pending to it any more: the next look takes it out of the index.
        await rr.zadd(index, {c.id: 0})
        assert await rec.recovery.poll_deadlines() == 0
        assert await rr.zscore(index, c.id) is None
    finally:
        await c.close()
        await rec.close()


async def test_twenty_racing_recoverers_requeue_a_dead_entry_once(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await rr.xgroup_create(stream, group, id="0", mkstream=True)
    await produce(redis_server.url, service, "contested")
    reply = await rr.xreadgroup(group, "redis-consumer-dead", {stream: ">"}, count=1)
    assert reply  # pending to a consumer that died with no lease
    recoverers = [client(redis_server.url, service, f"r{i}", recovery=False) for i in range(20)]
    try:
        entry_id = (await rr.xpending_range(stream, group, "-", "+", 1))[0]["message_id"].decode()
        results = await asyncio.gather(*(r.claim(entry_id) for r in recoverers))
        assert sum(results) == 1
        entries = await lbs_entries(rr, service)
        assert len(entries) == 1 and entries[0][b"_retry_count"] == b"1"
        assert entries[0][b"_original_id"] == entry_id.encode()
        assert (await rr.xpending(stream, group))["pending"] == 0
    finally:
        for r in recoverers:
            await r.close()


async def test_a_poison_pill_lands_in_the_dead_letter_stream(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    # Every consumer that takes "poison-1" dies on it. Each new consumer's
    # recovery re-queues the dead one's stream with one more retry and takes
    # it, and dies, until the count passes max_retries (3, the default).
    ttl = 0.3
    await produce(redis_server.url, service, "poison-1")
    first_id = (await rr.xrange(lbs.input_stream(service)))[0][0].decode()
    deaths = 0

    async def dead_lettered() -> bool:
        return bool(await rr.exists(lbs.dead_letter_stream(service)))

    for attempt in range(8):
        proc = spawn(redis_server.url, service, f"victim-{attempt}", ttl, flags="poison")
        try:
            while proc.poll() is None and not await dead_lettered():
                await asyncio.sleep(0.05)
            if proc.poll() == 3:
                deaths += 1
        finally:
            stop(proc)
        if await dead_lettered():
            break
    assert deaths == 4  # deliveries with retry counts 0, 1, 2, 3
    ((_, fields),) = await rr.xrange(lbs.dead_letter_stream(service))
    assert fields[b"_retry_count"] == b"4"
    assert fields[b"_original_id"] == first_id.encode()
    # Why: its holders' leases were gone (re-queued by the scan or the poller: "lease ...").
    reason = fields[b"_reason"]
    assert b"lease" in reason, reason
    assert fields[b"_consumer"].startswith(b"redis-consumer-victim-")
    assert fields[b"lbs-input"] == lbs.encode_input("poison-1")
    assert await rr.xlen(lbs.input_stream(service)) == 0


async def test_an_entry_trimmed_before_requeue_is_handled(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await rr.xgroup_create(stream, group, id="0", mkstream=True)
    await produce(redis_server.url, service, "gone")
    await rr.xreadgroup(group, "redis-consumer-dead", {stream: ">"}, count=1)
    entry_id = (await rr.xpending_range(stream, group, "-", "+", 1))[0]["message_id"].decode()
    await rr.xtrim(stream, maxlen=0)
    rec = client(redis_server.url, service, "rescuer", recovery=False)
    try:
        assert await rec.claim(entry_id) is False
        assert rec.metrics.get("recovery_trimmed_total") == 1
        assert (await rr.xpending(stream, group))["pending"] == 0  # the reference was cleaned
    finally:
        await rec.close()


async def test_fifty_slow_entries_do_not_hide_a_dead_one(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await rr.xgroup_create(stream, group, id="0", mkstream=True)
    await produce(redis_server.url, service, *[f"slow-{i}" for i in range(50)], "dead")
    # The first page (scan_batch 50): alive (their holder's lease lives); the 51st: its holder's is gone.
    await rr.xreadgroup(group, "redis-consumer-slow", {stream: ">"}, count=50)
    await rr.xreadgroup(group, "redis-consumer-dead", {stream: ">"}, count=1)
    await rr.set(lbs.lease_key(service, "redis-consumer-slow"), "nonce-of-slow", px=60_000)
    await asyncio.sleep(0.7)  # past min_idle
    rec = client(redis_server.url, service, "rescuer", lock_ttl=0.2, min_idle=0.5, recovery=False)
    try:
        assert await rec.recovery.scan() == {"requeued": 1, "alive": 50, "pending": 51}
        (entry,) = [e for e in await lbs_entries(rr, service) if b"_retry_count" in e]
        assert entry[b"lbs-input"] == lbs.encode_input("dead")
        assert (await rr.xpending(stream, group))["pending"] == 50  # the slow ones keep theirs
    finally:
        await rec.close()


async def test_chaos_every_stream_done_exactly_once_by_a_lock_holder(
    redis_server: Any, rr: aioredis.Redis, service: str
) -> None:
    n, ttl = 2000, 0.5
    names = [f"c{i}" for i in range(n)]
    async with lbs.Producer(redis_server.url, service) as p:
        for i in range(0, n, 500):
            await p.add_streams(names[i : i + 500])
    work = 0.25  # 4 workers x 20 streams at a time: about 7 s of work to disturb
    procs = [
        spawn(redis_server.url, service, f"w{i}", ttl, work=work, quiet=True) for i in range(4)
    ]
    rng = random.Random(7)
    spawned = 4
    audit = f"audit:{service}"
    lbs_key = lbs.input_stream(service)

    async def attempts() -> dict[str, dict[str, str]]:
        """Every attempt that reached done_stream, by token and stream (a read's entries share
        its token). A worker writes CALLING, then the result; CALLING alone means it was killed
        inside done_stream, outcome unknown (UNKNOWN)."""
        out: dict[str, dict[str, str]] = {}
        for _, f in await rr.xrange(audit):
            r = {k.decode(): v.decode() for k, v in f.items()}
            attempt = f"{r['token']} {r['stream']}"
            if r["status"] != "CALLING" or attempt not in out:
                out[attempt] = r
        return {
            t: ({**r, "status": "UNKNOWN"} if r["status"] == "CALLING" else r)
            for t, r in out.items()
        }

    def completions(by_token: dict[str, dict[str, str]]) -> dict[str, list[dict[str, str]]]:
        # DONE: acked and deleted under our lease. (LOCK_EXPIRED, which the
        # lease never answers, would say: our lease had lapsed but nobody had
        # taken the entry over, so ours was the only attempt; acked and deleted.) UNKNOWN counts only for a stream
        # with no other completion, once the LBS is empty (nothing re-queued
        # it, so its done_stream did run).
        done: dict[str, list[dict[str, str]]] = {}
        for r in by_token.values():
            if r["status"] in ("DONE", "LOCK_EXPIRED"):
                done.setdefault(r["stream"], []).append(r)
        for r in by_token.values():
            if r["status"] == "UNKNOWN" and r["stream"] not in done:
                done[r["stream"]] = [r]
        return done

    async def finished() -> bool:
        return await rr.xlen(lbs_key) == 0 and len(completions(await attempts())) >= n

    try:
        deadline = time.monotonic() + 120
        while not await finished() and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            victim = rng.randrange(len(procs))
            action = rng.random()
            proc = procs[victim]
            if action < 0.15 and proc.poll() is None:
                stop(proc)  # kill -9 mid-stream
                procs[victim] = spawn(
                    redis_server.url, service, f"w{spawned}", ttl, work=work, quiet=True
                )
                spawned += 1
            elif action < 0.3 and proc.poll() is None:
                os.kill(proc.pid, signal.SIGSTOP)  # stall past the TTL, then resume
                await asyncio.sleep(ttl * 2)
                os.kill(proc.pid, signal.SIGCONT)
    finally:
        for proc in procs:
            stop(proc)
    by_token = await attempts()
    records = list(by_token.values())
    by_stream = completions(by_token)
    missing = sorted(set(names) - set(by_stream))
    if missing:
        # Say where the missing ones are: their attempts, and what the LBS
        # still holds for them (an entry, pending to whom, its holder's lease alive or not).
        left = {}
        for eid, f in await rr.xrange(lbs_key):
            left[lbs.decode_input(f[b"lbs-input"])[0]] = eid.decode()
        pel = {
            p["message_id"].decode(): (p["consumer"].decode(), p["time_since_delivered"])
            for p in await rr.xpending_range(
                lbs_key, lbs.group_name(service), min="-", max="+", count=5000
            )
        }
        detail = {}
        for m in missing[:3]:
            pending = pel.get(left.get(m, ""))
            detail[m] = {
                "attempts": [r for r in records if r["stream"] == m],
                "entry": left.get(m),
                "pending": pending,
                "leased": pending is not None
                and bool(await rr.exists(lbs.lease_key(service, pending[0]))),
            }
        raise AssertionError(
            f"{len(missing)} streams never done: {missing[:25]}; first ones: {detail}"
        )
    twice = {s: rs for s, rs in by_stream.items() if len(rs) > 1}
    assert not twice, f"done twice: {list(twice.items())[:3]}"
    # No two consumers held one stream at the same time. The attempt that
    # completed held the stream from its start to its end (DONE: under its
    # lease; LOCK_EXPIRED: nobody took it over), so no other attempt on that
    # stream may start inside that interval, nor span its start. A token and
    # a stream name are unique per attempt.
    per_stream: dict[str, list[dict[str, str]]] = {}
    for r in records:
        per_stream.setdefault(r["stream"], []).append(r)
    overlaps = []
    for name, (d,) in by_stream.items():
        d0, d1 = float(d["start"]), float(d["end"])
        for other in per_stream[name]:
            if other is d:
                continue
            a0, a1 = float(other["start"]), float(other["end"])
            if d0 < a0 < d1 or (other["status"] != "LOCK_LOST" and a0 < d0 < a1):
                overlaps.append((name, d, other))
    assert not overlaps, overlaps[:3]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    print(f"chaos: {spawned - 4} kills, {len(records)} attempts reached done_stream: {statuses}")
    assert await rr.xlen(lbs.input_stream(service)) == 0


async def test_a_go_lock_key_that_is_not_utf8_does_not_cut_the_keyspace_listener(
    redis_server: Any, r: aioredis.Redis, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Beside a Go fleet the listener hears every Go-style lock key's expiry; a key name that is not
    UTF-8 (any process may write one) is read with replacement, not a failure that drops the
    subscription and the events with it."""
    c = client(redis_server.url, service, "c1", go_compatible=True)
    await c.start()
    try:
        listening = probe(c).recovery.listening
        await asyncio.wait_for(listening.wait(), 10)
        await r.set(b"bad\xff" + GO_MUTEX_KEY_SEP.encode() + b"1-1", "x", px=10)
        await eventually(lambda: _gone(r, b"bad\xff"), timeout=10)  # expired: the event was sent
        await asyncio.sleep(0.3)  # the listener has read it
        assert listening.is_set()
    finally:
        await c.close()
    assert not [m for m in caplog.messages if "keyspace listener lost" in m], caplog.messages


async def _gone(r: aioredis.Redis, prefix: bytes) -> bool:
    return not [k async for k in r.scan_iter(match=prefix + b"*")]
