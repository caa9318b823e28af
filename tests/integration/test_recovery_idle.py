"""What an idle client's deadline poller costs Redis: a rare poll, and one that reads one ZRANGE."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from lbs._consumer.recovery import Recovery
from lbs._keys import consumers_key, reaped_key

from _helpers import client, command_calls, reap

pytestmark = pytest.mark.timeout(60)


async def test_a_reap_that_finds_nothing_due_writes_only_the_time_of_the_call(
    r: aioredis.Redis, service: str
) -> None:
    assert await reap(r, service) == [[], -1]  # the index empty
    assert await r.exists(reaped_key(service))
    now_ms = int(await r.get(reaped_key(service)))
    await r.zadd(consumers_key(service), {"c1": now_ms + 30_000})
    gone, next_ms = await reap(r, service)
    assert gone == []
    assert 0 < next_ms <= 30_000  # the earliest deadline, still ahead
    assert await r.zscore(consumers_key(service), "c1") == now_ms + 30_000
    # Once c1 is due (no lease, nothing pending) it leaves the index.
    await r.zadd(consumers_key(service), {"c1": 1})
    assert await reap(r, service) == [[], -1, [], []]
    assert await r.zscore(consumers_key(service), "c1") is None


async def test_an_idle_client_polls_the_deadline_index_rarely(
    redis_server: Any, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: list[str] = []
    real = Recovery.poll_deadlines

    async def counted(self: Recovery, path: str = "deadline") -> int:
        polls.append(path)
        return await real(self, path)

    monkeypatch.setattr(Recovery, "poll_deadlines", counted)
    # Keep-alive a quarter TTL (2.5 s); four polls a second before.
    c = client(redis_server.url, service, "idle", lock_ttl=10.0, deadline_poll_interval=0.25)
    async with c:
        await asyncio.sleep(3.0)
    assert len(polls) <= 3, polls  # a loaded machine only makes them fewer


@pytest.mark.parametrize("fleet", [1, 2])
async def test_an_idle_fleets_timed_polls_send_no_script(
    any_server: Any, service: str, rr: aioredis.Redis, fleet: int
) -> None:
    """Recovery's deadline poll and the delayed retries' promotion look first with plain reads (TIME,
    the earliest due): on an idle fleet neither calls its script, and the last poll's time (the stall
    test's) keeps moving. Where the server has SET ... IFEQ the heartbeat sends no script either;
    elsewhere the tick and the poll time's refresh stay scripts. A lone poller too: after its first
    poll (a script, which says what time it wrote) its looks move the time on themselves."""
    # lock_ttl 2 s: a stall is a gap of 1 s, so each poller looks every 0.5 s and refreshes the
    # poll time when it is 0.25 s old; the heartbeat ticks every 0.67 s.
    clients = [client(any_server.url, service, f"idle-{i}", lock_ttl=2.0) for i in range(fleet)]
    for c in clients:
        await c.start()
    try:
        # Every client ticked twice (the second tick knows the server's clock) and polled once.
        await asyncio.sleep(2.0)
        before = await command_calls(rr)
        (seconds, micros), last = await rr.time(), int(await rr.get(reaped_key(service)))
        await asyncio.sleep(3.0)  # three stall thresholds
        after = await command_calls(rr)
        sent = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        assert sent.get("zrange", 0) >= 3 * fleet, (
            sent
        )  # the pollers looked (at least once a second)
        if any_server.set_ifeq:
            assert "evalsha" not in sent, sent
        # The stall test's time moved on: a poll now would not take the fleet for stalled.
        assert int(await rr.get(reaped_key(service))) > last
        assert int(await rr.get(reaped_key(service))) > seconds * 1000 + micros // 1000 - 1000
    finally:
        for c in clients:
            await c.close()
