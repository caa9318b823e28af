"""lbs-claim against real Redis 8.6 (and Debian's 7.0 and Valkey 9.1, where it steps aside)."""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import entry_points
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs_claim import ClaimReader, plugin

# lock_ttl 0.2 s: a heartbeat every 0.1 s refreshing a live entry's idle time
# every 2 ticks, so live work is never idle past 0.2 s; the threshold (the
# default, scan_min_idle) is 0.5 s.
FAST = dict(read_block=0.1, lock_ttl=0.2, min_idle=0.5)


def claimer(url: str, service: str, reader: ClaimReader | None = None, **config: Any) -> lbs.Client:
    cfg = lbs.Config(**{**FAST, "recovery": False, **config})
    return lbs.Client(
        url,
        service,
        "claimer",
        cfg,
        plugins=[reader or ClaimReader()],
        load_entrypoint_plugins=False,
    )


async def next_added(c: lbs.Client, timeout: float = 10.0) -> lbs.Notification:
    async def first() -> lbs.Notification:
        async for note in c.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                return note
        raise AssertionError("notifications ended")

    return await asyncio.wait_for(first(), timeout)


def test_the_entry_point_is_published() -> None:
    (ep,) = [ep for ep in entry_points(group="lbs") if ep.name == "claim"]
    assert ep.load() is plugin


@pytest.mark.skip(
    reason="issue 44: lbs no longer reads with XREADGROUP ... CLAIM (an entry is held by its consumer's "
    "lease, however idle); recovery follows the lease, and lbs-claim is being retired"
)
async def test_a_stopped_consumers_work_comes_back_with_new_work(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    producer = lbs.Producer(r, service)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    await producer.add_stream("orphaned")
    assert await r.xreadgroup(
        group, "redis-consumer-stopped", {stream: ">"}, count=1
    )  # then it stopped
    await asyncio.sleep(0.6)  # idle past the 0.5 s threshold; time is the subject here
    await producer.add_stream("fresh")
    c = claimer(redis_server.url, service)
    await c.start()
    try:
        assert c.read_strategy.name == "claim" and c.read_strategy.claim_min_idle == 0.5
        assert c.read_strategy.reconciliation_interval == 600.0
        notes = {(await next_added(c)).stream for _ in range(2)}
        assert notes == {"orphaned", "fresh"}
    finally:
        await c.close()


async def test_a_live_lbs_holder_is_never_claimed_from(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await lbs.Producer(r, service).add_stream("busy")
    holder = lbs.Client(
        redis_server.url, service, "holder", lbs.Config(**FAST), load_entrypoint_plugins=False
    )
    await holder.start()
    c = claimer(redis_server.url, service)
    try:
        note = await next_added(holder)
        await c.start()
        # Three thresholds long the claimer keeps reading (an empty read every
        # read_block); the holder's heartbeat keeps the entry's idle time low.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert c.stats.taken == 0
            await asyncio.sleep(0.1)
        assert await holder.done_stream(note.stream) is lbs.DoneStatus.DONE
    finally:
        await c.close()
        await holder.close()


@pytest.mark.parametrize("kind", ["redis", "redis7", "valkey"])
async def test_retired_it_steps_aside_with_one_warning_and_the_client_works(
    kind: str, request: pytest.FixtureRequest, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On every server: one warning that it is retired, then default reads (the lease holds live work)."""
    server = request.getfixturevalue(f"{kind}_server")
    reader = ClaimReader()
    async with lbs.Producer(server.url, service) as p:
        await p.add_streams(["a"])
    for name in ("claimer", "second"):
        c = lbs.Client(
            server.url,
            service,
            name,
            lbs.Config(**{**FAST, "recovery": False}),
            plugins=[reader],
            load_entrypoint_plugins=False,
        )
        try:
            await c.start()
            assert c.read_strategy.name == "default"
            if name == "claimer":
                note = await next_added(c)
                assert await c.done_stream(note.stream) is lbs.DoneStatus.DONE
        finally:
            await c.close()
    warnings = [r for r in caplog.records if r.name == "lbs_claim" and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "lbs-claim is retired" in warnings[0].getMessage()


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LBS_CLAIM_MIN_IDLE", "45")
    monkeypatch.setenv("LBS_CLAIM_SCAN_INTERVAL", "120")
    s = ClaimReader().strategy(lbs.Config())
    assert (s.claim_min_idle, s.reconciliation_interval) == (45.0, 120.0)
    monkeypatch.setenv("LBS_CLAIM_MIN_IDLE", "soon")
    with pytest.raises(lbs.ConfigurationError, match="LBS_CLAIM_MIN_IDLE"):
        ClaimReader().strategy(lbs.Config())


def test_an_instance_the_application_passes_outranks_the_installed_one() -> None:
    mine = ClaimReader(min_idle=45.0)
    c = lbs.Client(
        "redis://127.0.0.1:1", "svc", "c", plugins=[mine, plugin]
    )  # entry points loaded too
    assert c.pm.get_plugin("claim") is plugin  # installed, registered once even though passed again
    # Retired, it steps aside: the built-in reader (asked last) answers.
    assert c.pm.hook.lbs_reader(client=c, server_version=(8, 6, 0)).name == "default"
    assert mine.strategy(c.config).claim_min_idle == 45.0
