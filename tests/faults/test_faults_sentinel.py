"""Fault: the master of a Sentinel set killed with -9 mid-run; Sentinel promotes the replica.

One master, one replica (``replicaof``), three ``redis-server --sentinel`` on loopback (quorum 2,
``down-after-milliseconds`` 1000, ``failover-timeout`` 3000). A fleet of consumers
(``Client.run``) reaches Redis through ``redis+sentinel://`` only, while a producer registers
streams through the same URL; the test kills the master (``SCALE`` times in turn at the full
size: each killed master comes back as a replica of the new one before the next kill).

The guarantee judged: no registration is lost once its XADD was acknowledged **and replicated**.
Replication is asynchronous, so an acknowledged XADD the replica had not received when the master
died is gone (nothing in Redis can tell the producer); what ``WAIT 1`` confirmed is not. The test
confirms its own way, as an application would: after a batch is acknowledged, one write of its own
(``INCR``) and ``WAIT 1 1000`` on its connection: replication is one ordered stream, so the
replica's acknowledgement of that write covers the XADDs before it. A batch counts as confirmed
only when no kill happened between its XADD and the WAIT's reply (else the WAIT may have been
answered by the next master). Confirmed streams must all be finished (lost = 0); unconfirmed ones
are counted, and how many of them the failover lost.

Also judged: never two valid holders at once; fencing tokens monotonic across each failover (a
lossy failover leaves the new master's counter behind tokens already handed out: ``_fence.lua``
moves it up to the server clock); ``notify-keyspace-events`` set again on the new master. Printed:
re-deliveries (runs beyond one per stream: locks lost with the old master, handlers whose local
lease ran out during the outage) and the time from the kill to the first stream finished on the
new master (``resume_s``: no DONE can come from the old master more than 0.5 s after the kill,
nor from the new one before ``down-after-milliseconds``; printed, bounded only by 60 s).

And nothing left unclosed: once the test is over, a garbage collection finds no socket, transport or
redis-py connection left open (the failover's discoveries of the new master, many at once, used to
drop a Sentinel's client from redis-py's list, which no ``aclose()`` closed then);
:func:`test_discoveries_at_once_keep_and_close_every_sentinel` is that cause alone.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import RedisError
from test_faults_restarts import has_kx, keyspace_flags

import lbs
from lbs._redis.connection import open_plain
from lbs.embedded.sentinel import SentinelSet

from _fleet import SCALE, SETTLE, TEST_TIMEOUT, Fleet, Recorder, Report, config, eventually, verdict

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

DOWN_AFTER_MS = 1000
#: No DONE read later than this after the kill can come from the dead master (its last replies
#: arrive at once), and none from the new one sooner (Sentinel waits DOWN_AFTER_MS first).
AFTER_KILL = 0.5
RESUME_BOUND = 60.0


class TimedRecorder(Recorder):
    """The fleet's recorder, also timing every lock taken and every DONE."""

    def __init__(self) -> None:
        super().__init__()
        self.acquired: list[tuple[float, int]] = []  # (when, token)
        self.finished_at: list[float] = []  # when a done said DONE

    @lbs.hookimpl
    def lbs_lock_acquired(self, client: Any, stream: str, entry_id: str, token: int) -> None:
        self.acquired.append((time.monotonic(), token))

    @lbs.hookimpl
    def lbs_lock_released(self, client: Any, token: int, status: lbs.DoneStatus) -> None:
        super().lbs_lock_released(client, token, status)
        if status is lbs.DoneStatus.DONE:
            self.finished_at.append(time.monotonic())


class SentinelFleet(Fleet):
    """A :class:`Fleet` whose clients, producer and own look at Redis all use the Sentinel URL."""

    def __init__(self, sentinels: SentinelSet, service: str, **kwargs: Any) -> None:
        super().__init__(sentinels.master().url, service, **kwargs)  # replaced below
        self.url = sentinels.url
        self.rec = TimedRecorder()
        self._plain, self.r = self.r, open_plain(self.url)

    async def __aenter__(self) -> SentinelFleet:
        await self._plain.aclose()
        await super().__aenter__()
        return self


class Feeder:
    """Registers ``<prefix>-<i>`` in batches and confirms each batch's replication (see the module)."""

    def __init__(self, fleet: SentinelFleet) -> None:
        self.fleet = fleet
        self.kills = 0  # bumped by the test as it kills a master
        self.confirmed: list[str] = []
        self.unconfirmed: list[str] = []
        self.marker = f"{{{fleet.lbs_key}}}:test-marker"

    async def run(self, prefix: str, total: int, duration: float, batch: int = 10) -> None:
        names = [f"{prefix}-{i}" for i in range(total)]
        start = time.monotonic()
        for k in range(0, total, batch):
            due = start + duration * k / total
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            chunk, kills = names[k : k + batch], self.kills
            if not await self.fleet.register(chunk):
                continue  # not acknowledged (the fleet counts it as uncertain or not registered)
            try:
                await self.fleet.r.incr(self.marker)
                replicas = int(await self.fleet.r.wait(1, 1000))
            except RedisError:
                replicas = 0
            ok = replicas >= 1 and kills == self.kills
            (self.confirmed if ok else self.unconfirmed).extend(chunk)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fails the test that left a socket, transport or redis-py connection unclosed (collected here,
    when the test is over, not left to fail whichever later test the garbage collection lands in)."""
    yield
    leaks = _collect_leaks()
    assert not leaks, f"{len(leaks)} unclosed objects collected after the test:\n" + "\n".join(
        leaks[:12]
    )


async def test_discoveries_at_once_keep_and_close_every_sentinel() -> None:
    """The failover's leak alone: with the first Sentinel of the URL dead, commands at once on new
    connections each ask the Sentinels for the master (as every task of a consumer does when the
    master is gone); the one that answered moves to the front of the list and every Sentinel's
    client stays in it once, so that closing the client closes them all.

    (redis-py's discovery swaps the Sentinel that answered with the first by the index it had when
    asked: two discoveries at once put one client in twice and dropped the first's, never closed.)"""
    with SentinelSet(replicas=0) as sentinels:
        sentinels.sentinels[0].kill()
        r = open_plain(sentinels.url)
        manager = r.connection_pool.sentinel_manager
        clients = list(manager.sentinels)
        try:
            await asyncio.gather(*(r.ping() for _ in range(8)))
            assert sorted(map(id, manager.sentinels)) == sorted(map(id, clients)), (
                "a Sentinel's client is in the list twice and another's is gone: "
                f"{[c.connection_pool.connection_kwargs['port'] for c in manager.sentinels]}"
            )
            assert manager.sentinels[0] is not clients[0]  # the one that answered comes first
        finally:
            await r.aclose()  # closes the clients in the list (what is left open: no_leaks)


async def test_sentinel_failover_loses_nothing_replicated(service: str, report: Report) -> None:
    failovers = 1 if SCALE == 1 else 3
    duration = 6.0 * SCALE
    with SentinelSet(down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=3000) as sentinels:
        # lock_ttl 5 s: longer than a failover here, so holders keep their locks through it.
        async with SentinelFleet(sentinels, service, cfg=config(lock_ttl=5.0)) as fleet:
            rec = fleet.rec
            assert isinstance(rec, TimedRecorder)
            feeder = Feeder(fleet)
            feeding = asyncio.create_task(feeder.run("s", int(100 * duration), duration))
            kills: list[tuple[float, float]] = []  # (killed, promotion seen)
            flags: list[str] = []
            try:
                for _ in range(failovers):
                    await asyncio.sleep(duration / (failovers + 1))
                    old = sentinels.master()
                    feeder.kills += 1
                    t_kill = time.monotonic()
                    old.kill()
                    new = await asyncio.to_thread(sentinels.wait_promoted, old, RESUME_BOUND)
                    kills.append((t_kill, time.monotonic()))

                    async def resumed(t: float = t_kill) -> bool:
                        return any(f > t + AFTER_KILL for f in rec.finished_at)

                    await eventually(resumed, RESUME_BOUND, what="processing resumed")

                    async def flags_back() -> bool:
                        flags.append(await keyspace_flags(fleet.r))
                        return has_kx(flags[-1])

                    await eventually(flags_back, 15, every=0.2, what="keyspace flags")
                    sentinels.rejoin(
                        old
                    )  # this thread: the server dies with the one that starts it
                    await asyncio.to_thread(sentinels.wait_ready, new)
            finally:
                await feeding
            settled = await fleet.settle(feeder.confirmed, timeout=SETTLE)
            resume = []
            for t_kill, _ in kills:
                after = [f - t_kill for f in rec.finished_at if f > t_kill + AFTER_KILL]
                resume.append(min(after) if after else None)
            backwards = []
            for t_kill, t_seen in kills:
                before = max((tok for t, tok in rec.acquired if t < t_kill), default=0)
                backwards += [tok for t, tok in rec.acquired if t > t_seen and tok <= before]
            finished = {r.stream for r in rec.runs if rec.completed(r)}
            runs_per_stream = len(rec.runs) - len({r.stream for r in rec.runs})
            fig = await fleet.figures(
                "sentinel-failover",
                len(kills),
                names=feeder.confirmed,
                settled=settled,
                redelivered=runs_per_stream,
                unconfirmed=len(feeder.unconfirmed),
                unconfirmed_lost=sum(1 for n in feeder.unconfirmed if n not in finished),
                promote_s="/".join(f"{b - a:.1f}" for a, b in kills),
                resume_s="/".join("-" if r is None else f"{r:.1f}" for r in resume),
                tokens_backwards=len(backwards),
                keyspace_events=(flags or ["?"])[-1],
            )
            why = fleet.explain(feeder.confirmed)
    report(fig)
    problems = fig.problems(duplicated=False, retries=False)  # re-deliveries are the price
    if not settled:
        problems.append(fig.unsettled())
    if len(feeder.confirmed) < 50:
        problems.append(f"only {len(feeder.confirmed)} registrations confirmed by WAIT")
    if any(r is None or r > RESUME_BOUND for r in resume):
        problems.append(f"processing did not resume within {RESUME_BOUND:.0f}s of a kill: {resume}")
    if backwards:
        problems.append(f"{len(backwards)} tokens taken after a failover <= one taken before it")
    if not has_kx((flags or [""])[-1]):
        problems.append(f"notify-keyspace-events on the new master is {flags[-1:]}: not set again")
    verdict(problems, why)


def _collect_leaks() -> list[str]:
    """Collect garbage now and return what ``__del__`` reported (unclosed sockets, transports and
    redis-py connections: under the suite's ``-W error`` their ResourceWarnings are raised, so
    unraisable) instead of letting it fail a later test."""
    leaks: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = leaks.append
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook
    return [f"{u.err_msg or 'Exception ignored in'}: {u.object!r}: {u.exc_value!r}" for u in leaks]
