"""Redis Sentinel on real servers (lbs.embedded.sentinel: a master, a replica, three Sentinels):
``redis+sentinel://`` through the library's entry points, the master's password apart from the
Sentinels' own, a ``master_for`` client passed by hand, and a failover whose old master stays up
(``SENTINEL FAILOVER``: demoted to a replica, it would answer READONLY). The kill -9 failover
under a fleet is tests/faults/test_faults_sentinel.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError
from redis.retry import Retry

import lbs
from lbs._redis.connection import resolve_client
from lbs.embedded.sentinel import SentinelSet
from lbs.events import read_events
from lbs.status import collect_status

from _helpers import client, eventually, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MASTER_PW, SENTINEL_PW = "master-pw-1", "sentinel-pw-1"


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    with SentinelSet(password=MASTER_PW, sentinel_password=SENTINEL_PW) as s:
        yield s


@pytest.fixture
def url(sentinels: SentinelSet) -> str:
    """The set's URL: the master's password in it, the Sentinels' as ``?sentinel_password=``."""
    return f"{sentinels.url}/0?sentinel_password={SENTINEL_PW}"


async def _run_until(c: lbs.Client, names: set[str], seen: list[str]) -> None:
    async def handle(note: lbs.Notification) -> None:
        seen.append(note.stream)

    task = asyncio.create_task(c.run(handle))
    try:

        async def all_seen() -> bool:
            return names <= set(seen)

        await eventually(all_seen, timeout=30)
    finally:
        await c.close()
        await task


async def test_the_library_takes_the_url(url: str, service: str) -> None:
    await produce(url, service, "a", "b")
    seen: list[str] = []
    await _run_until(client(url, service), {"a", "b"}, seen)
    st = await collect_status(url, service)
    assert st.exists and st.length == 0 and st.backlog == 0
    kinds = {e.kind for e in await read_events(url, service)}
    assert "started" in kinds
    async with lbs.DeadLetters(url, service) as dlq:
        assert await dlq.count() == 0
    async with lbs.Publisher(url, service) as pub:
        await pub.publish("k1", {"n": "1"})


async def test_the_urls_password_is_the_masters_not_the_sentinels(sentinels: SentinelSet) -> None:
    # No sentinel_password: the Sentinels refuse the lookup (their password is not the URL's).
    r, _ = resolve_client(sentinels.url)
    try:
        with pytest.raises(MasterNotFoundError, match="uthentication"):
            await r.connection_pool.sentinel_manager.discover_master(sentinels.name)
    finally:
        await r.aclose()
    # The Sentinels' password but not the master's: the Sentinels answer, the master refuses.
    hosts = sentinels.url.split("@", 1)[1]
    r, _ = resolve_client(f"redis+sentinel://{hosts}?sentinel_password={SENTINEL_PW}")
    try:
        conn = r.connection_pool.make_connection()
        conn.retry = Retry(NoBackoff(), 0)  # redis-py would try an auth failure 3 more times
        with pytest.raises(AuthenticationError):
            await conn.connect()
        await conn.disconnect()
    finally:
        await r.aclose()


async def test_a_master_for_client_passed_by_hand(sentinels: SentinelSet, service: str) -> None:
    manager = Sentinel(
        [(s.host, s.port) for s in sentinels.sentinels],
        sentinel_kwargs={"password": SENTINEL_PW},
    )
    master = manager.master_for(sentinels.name, password=MASTER_PW)
    try:
        async with lbs.Producer(master, service) as producer:
            await producer.add_streams(["a", "b", "c"])
        seen: list[str] = []
        await _run_until(client(master, service), {"a", "b", "c"}, seen)
    finally:
        await master.aclose()
        await manager.aclose()


async def test_a_failover_whose_old_master_stays_up_is_followed(
    sentinels: SentinelSet, url: str, service: str
) -> None:
    seen: list[str] = []

    async def handle(note: lbs.Notification) -> None:
        seen.append(note.stream)

    c = client(url, service, lock_ttl=5.0)
    task = asyncio.create_task(c.run(handle))
    try:
        async with lbs.Producer(url, service) as producer:
            await producer.add_streams(["before"])

            async def has(name: str) -> bool:
                return name in seen

            await eventually(lambda: has("before"), timeout=30)
            old = sentinels.master()
            with sentinels.sentinels[0].client() as s:
                s.execute_command("SENTINEL", "FAILOVER", sentinels.name)
            new = await asyncio.to_thread(sentinels.wait_promoted, old)
            with old.client() as demoted:  # alive, a replica now: writes there answer READONLY

                def is_replica() -> bool:
                    return demoted.info("replication")["role"] == "slave"

                await eventually(lambda: asyncio.to_thread(is_replica), timeout=30)
            # The producer's connection (to the old master) was killed or answers READONLY: the
            # batch is sent again on a connection to the new master, once; a failure is retried here.
            for _ in range(50):
                try:
                    await producer.add_streams(["after"])
                    break
                except lbs.BatchError:
                    await asyncio.sleep(0.2)
            await eventually(lambda: has("after"), timeout=30)
        assert new.port != old.port
    finally:
        await c.close()
        await task
