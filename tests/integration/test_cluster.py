"""lbs on a real 3-master Redis Cluster: routing to the slot owner, recovery there, one slot per service."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

import lbs
from lbs.embedded import RedisClusterServers
from lbs.testing import freeze

from _helpers import client, eventually, is_true, take

pytestmark = pytest.mark.cluster


def _owner_and_other(cluster: RedisClusterServers, key: str) -> tuple[str, tuple[str, int]]:
    """The name (host:port) of the master owning ``key``'s slot, and another master's address."""
    with cluster.client() as c:
        owner = c.get_node_from_key(key)
        assert owner is not None
        other = next(n for n in c.get_primaries() if n.name != owner.name)
        return str(owner.name), (other.host, int(other.port))


def _client(rc: Any, service: str, consumer: str, **config: Any) -> lbs.Client:
    return client(
        rc, service, consumer, **{"lock_ttl": 0.5, "deadline_poll_interval": 0.05, **config}
    )


async def test_work_and_recovery_go_through_the_master_owning_the_slot(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    owner, (host, port) = _owner_and_other(redis_cluster, lbs.input_stream(service))
    rc = RedisCluster(host=host, port=port)  # a node that does not own the slot
    dier = _client(rc, service, "dier", recovery=False)
    c = _client(rc, service, "worker")
    try:
        # A consumer takes "x" and then stops (as if frozen; its process lives on).
        async with lbs.Producer(rc, service) as producer:
            await producer.add_stream("x")
        await dier.start()
        assert dier.node == owner
        (held,) = await take(dier, 1)
        assert held.stream == "x"
        await freeze(dier)  # it stops: no beats, no reads
        # A live consumer gets new work, and "x" back from the deadline poller
        # on the owner once the stopped one's lock has expired.
        async with lbs.Producer(rc, service) as producer:
            await producer.add_streams(["a", "b"])
        await c.start()
        assert c.node == owner
        notes = {n.stream: n for n in await take(c, 3, timeout=15)}
        assert sorted(notes) == ["a", "b", "x"]
        assert (notes["a"].retry_count, notes["x"].retry_count) == (0, 1)
        assert [await c.done_stream(s) for s in ("a", "b", "x")] == [lbs.DoneStatus.DONE] * 3
    finally:
        await c.close()
        await dier.close()
        await rc.aclose()


async def test_the_keyspace_listener_subscribes_on_the_slot_owner(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    owner, (host, port) = _owner_and_other(redis_cluster, lbs.input_stream(service))
    c = _client(f"redis+cluster://{host}:{port}", service, "listener")
    await c.start()
    try:
        await asyncio.wait_for(c.recovery.listening.wait(), 10)
        patterns = {}
        for node in redis_cluster.masters:
            with redis.Redis(host=node.host, port=node.port) as r:
                patterns[f"{node.host}:{node.port}"] = r.pubsub_numpat()
        assert patterns[owner] >= 1
        assert all(n == 0 for name, n in patterns.items() if name != owner)
    finally:
        await c.close()


async def test_every_key_the_library_writes_is_in_the_services_slot(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    (_, (host, port)) = _owner_and_other(redis_cluster, lbs.input_stream(service))
    rc = RedisCluster(host=host, port=port)
    slot = key_slot(lbs.input_stream(service).encode())
    try:
        async with lbs.Producer(rc, service) as producer:
            await producer.add_streams(["p", "q", "r"])
        await rc.xadd(
            lbs.input_stream(service), {"lbs-input": "{broken"}
        )  # to the dead-letter stream
        c = _client(rc, service, "keys")
        await c.start()
        notes = await take(c, 3)
        await c.done_stream(notes[0].stream)
        await c.heartbeat()
        await c.close()  # hands the other two back
        keys: list[bytes] = []
        for node in redis_cluster.masters:
            with redis.Redis(host=node.host, port=node.port) as r:
                keys += list(r.scan_iter(match=f"*{service}*", count=1000))
        names = {k.decode() for k in keys}
        assert lbs.input_stream(service) in names and lbs.dead_letter_stream(service) in names
        assert {k.decode(): key_slot(k) for k in keys} == {k.decode(): slot for k in keys}
    finally:
        await rc.aclose()


@pytest.fixture(scope="module")
def replicated_cluster() -> Any:
    """3 masters with a replica each, for failover (its own: a failover changes the topology)."""
    with RedisClusterServers(
        masters=3, replicas=1, config={"notify-keyspace-events": "Kx"}
    ) as cluster:
        yield cluster


def _replica_of(cluster: RedisClusterServers, master: str) -> redis.Redis:
    """A client of the replica of ``master`` (host:port)."""
    host, port = master.rsplit(":", 1)
    with redis.Redis(host=host, port=int(port)) as r:
        master_id = r.execute_command("CLUSTER", "MYID").decode()
    for node in cluster.nodes:
        r = redis.Redis(host=node.host, port=node.port)
        if (
            r.execute_command("ROLE")[0] == b"slave"
            and f"{r.info('replication')['master_port']}" == port
        ):
            assert r.execute_command("CLUSTER", "MYID").decode() != master_id
            return r
        r.close()
    raise AssertionError(f"no replica of {master}")


async def test_the_client_follows_a_failover_of_the_slot_owner_and_loses_nothing(
    replicated_cluster: RedisClusterServers, service: str
) -> None:
    stream = lbs.input_stream(service)
    owner, (host, port) = _owner_and_other(replicated_cluster, stream)
    rc = RedisCluster(host=host, port=port)
    c = _client(rc, service, "survivor", lock_ttl=1.0)
    try:
        async with lbs.Producer(rc, service) as producer:
            await producer.add_stream("before")
        await c.start()
        (held,) = await take(c, 1)
        await asyncio.wait_for(c.recovery.listening.wait(), 10)
        replica = _replica_of(replicated_cluster, owner)
        kw = replica.connection_pool.connection_kwargs
        new_owner = f"{kw['host']}:{kw['port']}"
        stale = RedisCluster(host=host, port=port)  # its slot map will be out of date
        await stale.initialize()
        replica.execute_command(
            "CLUSTER", "FAILOVER"
        )  # manual: the replica catches up first, nothing lost
        await eventually(lambda: _is_master(replica), timeout=15)
        # The heartbeat's next write meets a redirect, and the client moves.
        await eventually(lambda: is_true(c.node == new_owner), timeout=15)
        assert c.metrics.get("topology_changes_total") == 1
        assert await c.done_stream(held.stream) is lbs.DoneStatus.DONE  # the lock came across
        async with lbs.Producer(stale, service) as producer:  # a batch meets MOVED: re-routed once
            assert len(await producer.add_streams(["after"])) == 1
        await stale.aclose()
        (note,) = await take(c, 1, timeout=15)
        assert note.stream == "after" and note.retry_count == 0
        assert await c.done_stream("after") is lbs.DoneStatus.DONE
        # The listener resubscribed on the new owner.
        await eventually(lambda: is_true(replica.pubsub_numpat() >= 1), timeout=15)
        assert (await rc.xpending(stream, lbs.group_name(service)))["pending"] == 0
        assert await rc.xlen(stream) == 0
    finally:
        await c.close()
        await rc.aclose()


async def _is_master(r: redis.Redis) -> bool:
    return bool(r.execute_command("ROLE")[0] == b"master")


def _migrate_slot(
    cluster: RedisClusterServers, slot: int, source: str, target: tuple[str, int]
) -> None:
    """Move ``slot`` from master ``source`` (host:port) to ``target`` the classic way: IMPORTING /
    MIGRATING, MIGRATE of every key (TTLs kept), then SETSLOT NODE on every master."""
    shost, sport = source.rsplit(":", 1)
    with (
        redis.Redis(host=shost, port=int(sport)) as src,
        redis.Redis(host=target[0], port=target[1]) as dst,
    ):
        src_id = src.execute_command("CLUSTER", "MYID").decode()
        dst_id = dst.execute_command("CLUSTER", "MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", target[0], target[1], "", 0, 5000, "KEYS", *keys)
        for node in cluster.masters:
            with redis.Redis(host=node.host, port=node.port) as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


async def test_the_client_follows_a_migration_of_the_services_slot(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    stream = lbs.input_stream(service)
    owner, target = _owner_and_other(redis_cluster, stream)
    rc = RedisCluster(host=target[0], port=target[1])
    c = _client(rc, service, "mover", lock_ttl=1.0)
    try:
        async with lbs.Producer(rc, service) as producer:
            await producer.add_stream("held")
        await c.start()
        (held,) = await take(c, 1)
        await asyncio.wait_for(c.recovery.listening.wait(), 10)
        _migrate_slot(redis_cluster, key_slot(stream.encode()), owner, target)
        await eventually(lambda: is_true(c.node == f"{target[0]}:{target[1]}"), timeout=15)
        assert (
            await c.done_stream(held.stream) is lbs.DoneStatus.DONE
        )  # the lock moved with its TTL
        async with lbs.Producer(rc, service) as producer:
            await producer.add_stream("after")
        (note,) = await take(c, 1, timeout=15)
        assert note.stream == "after"
        assert await c.done_stream("after") is lbs.DoneStatus.DONE
        with redis.Redis(host=target[0], port=target[1]) as r:
            await eventually(lambda: is_true(r.pubsub_numpat() >= 1), timeout=15)
        assert (await rc.xpending(stream, lbs.group_name(service)))["pending"] == 0
    finally:
        await c.close()
        await rc.aclose()


HOLDER = """
import asyncio, json, sys
import lbs

async def main(url, service):
    cfg = lbs.Config(lock_ttl=0.5, read_block=0.1, recovery=False)
    c = lbs.Client(url, service, "doomed", cfg, load_entrypoint_plugins=False)
    await c.start()
    async for note in c.notifications():
        print(json.dumps({"stream": note.stream}), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_kill_9_during_a_failover_is_recovered_by_the_scan(
    replicated_cluster: RedisClusterServers, service: str
) -> None:
    stream = lbs.input_stream(service)
    owner, (host, port) = _owner_and_other(replicated_cluster, stream)
    rc = RedisCluster(host=host, port=port)
    # The rescuer recovers by the scan alone: no keyspace events (a failover
    # may drop them), no deadline poller.
    rescuer = _client(
        rc,
        service,
        "rescuer",
        keyspace_recovery=False,
        deadline_poll_interval=3600.0,
        min_idle=1.2,
        reconciliation_interval=0.5,
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        f"redis+cluster://{host}:{port}",
        service,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        async with lbs.Producer(rc, service) as producer:
            await producer.add_stream("victim")
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert json.loads(line) == {"stream": "victim"}
        replica = _replica_of(replicated_cluster, owner)
        proc.kill()  # kill -9 of the holder...
        replica.execute_command("CLUSTER", "FAILOVER")  # ...while its slot's master fails over
        await eventually(lambda: _is_master(replica), timeout=15)
        await rescuer.start()
        (note,) = await take(rescuer, 1, timeout=20)
        assert note.stream == "victim" and note.retry_count == 1
        assert rescuer.metrics.get("recovery_scan_requeued_total", 0) >= 1
        assert await rescuer.done_stream("victim") is lbs.DoneStatus.DONE
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await rescuer.close()
        await rc.aclose()


async def test_keyspace_events_on_the_owner_recover_a_stopped_consumers_stream(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    # The deadline poller off: only the expired event, delivered on the slot's
    # owner (which the client reached through another node), can bring it back.
    owner, (host, port) = _owner_and_other(redis_cluster, lbs.input_stream(service))
    url = f"redis://{host}:{port}"
    oss = lbs.ClusterMode.OSS  # a plain URL of one node, and the mode saying it is a cluster
    dier = lbs.Client(
        url,
        service,
        "dier",
        lbs.Config(read_block=0.1, lock_ttl=0.5, recovery=False),
        load_entrypoint_plugins=False,
        cluster=oss,
    )
    rescuer = lbs.Client(
        url,
        service,
        "rescuer",
        lbs.Config(read_block=0.1, lock_ttl=0.5, deadline_poll_interval=3600.0),
        load_entrypoint_plugins=False,
        cluster=oss,
    )
    try:
        async with lbs.Producer(url, service, cluster=oss) as producer:
            await producer.add_stream("y")
        await dier.start()
        (held,) = await take(dier, 1)
        await freeze(dier)
        await rescuer.start()
        assert rescuer.node == owner
        await asyncio.wait_for(rescuer.recovery.listening.wait(), 10)
        (back,) = await take(rescuer, 1, timeout=20)
        assert back.stream == "y" and back.retry_count == 1
        # Re-queued under a new id (whatever the room), woken by the event.
        assert rescuer.metrics.get("recovery_keyspace_requeued_total") == 1
        assert back.entry_id != held.entry_id
    finally:
        await rescuer.close()
        await dier.close()
