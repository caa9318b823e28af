"""``lbs status SERVICE --shards N`` (issue 48): each shard's slot and the master owning it, its
counts, the legacy shards that still exist, how many shards each master owns; on a 3-master cluster
and on a single Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from rich.console import Console

import lbs
from lbs import _keys
from lbs._placement import legacy_names, slot_of
from lbs.cli.render import render_shards
from lbs.status import ShardedStatus, collect_shards

from _helpers import eventually, produce
from _pty import app_argv, flat, invoke, watched

pytestmark = pytest.mark.integration

ENTRY = {"lbs-input": '{"DataStreamName":"old","Info":{}}'}


def cluster_url(redis_cluster: Any) -> str:
    return "redis+cluster://" + redis_cluster.url.split("://", 1)[1]


async def test_on_a_3_master_cluster_each_master_owns_2_of_6(
    redis_cluster: Any, service: str
) -> None:
    url = cluster_url(redis_cluster)
    names = _keys.shard_services(service, 6)
    for i, name in enumerate(names):  # shard i holds i + 1 registrations
        await produce(url, name, *[f"s{j}" for j in range(i + 1)])
    # An earlier lbs's shard with work left in it; the other earlier names do not exist.
    legacy = legacy_names(service, 6)
    assert legacy, "every name of the layout is its earlier one: nothing legacy to show"
    old = legacy[-1]
    cluster = redis_cluster.client()
    try:
        cluster.xadd(_keys.input_stream(old), ENTRY)
        owner = {n: cluster.get_node_from_key(_keys.input_stream(n)).name for n in [*names, old]}
        primaries = sorted(node.name for node in cluster.get_primaries())
    finally:
        cluster.close()

    result = await invoke("status", service, "--shards", "6", "--url", url, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {
        "service",
        "shard_count",
        "previous_shards",
        "cluster",
        "shards",
        "masters",
        "balanced",
    }
    assert (doc["service"], doc["shard_count"], doc["cluster"]) == (service, 6, True)
    assert doc["masters"] == dict.fromkeys(primaries, 2) and doc["balanced"] is True
    rows = doc["shards"]
    assert [r["name"] for r in rows] == [*names, old]
    for i, row in enumerate(rows[:6]):
        assert (row["index"], row["of"], row["legacy"], row["why"]) == (i, 6, False, "")
        assert row["slot"] == slot_of(row["name"]) and row["node"] == owner[row["name"]]
        assert row["status"]["node"] == owner[row["name"]]
        assert (row["status"]["backlog"], row["status"]["pending"]) == (i + 1, 0)
        assert row["status"]["service"] == row["name"] and row["empty"] is False
    last = rows[6]
    assert (last["legacy"], last["slot"], last["node"]) == (True, slot_of(old), owner[old])
    assert last["index"] == int(old.rsplit(".", 1)[1]) and last["of"] == 6
    assert last["status"]["backlog"] == 1 and "earlier lbs" in last["why"]

    result = await invoke("status", service, "--shards", "6", "--url", url)
    assert result.exit_code == 0, result.stderr
    screen = flat(result.stdout)
    assert f"lbs status {service} · 6 shards · cluster" in screen
    for i, name in enumerate(names):
        assert f"{name} {slot_of(name)} {owner[name]} {i + 1} 0 0 alive 0" in screen
    assert f"{old} {slot_of(old)} {owner[old]} 1 0 0 alive 0 legacy" in screen
    assert (
        f"legacy {old} (named by an earlier lbs (shard {last['index']} of 6)): holds work" in screen
    )
    assert "shards per master: " + ", ".join(f"{p} 2" for p in primaries) in screen
    assert "uneven" not in screen


async def test_on_a_single_redis_with_consumers_and_a_layout_being_left(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    url = redis_server.url
    kw = r.connection_pool.connection_kwargs
    here = f"{kw['host']}:{kw['port']}"
    names = _keys.shard_services(service, 3)
    for name in names:
        await produce(url, name, "a", "b")
    # The 2-shard layout being left: one of its shards still holds a registration, one is empty
    # (only its dead letters are left), the earlier names of the 3-shard layout do not exist.
    left = _keys.shard_services(service, 2)
    await r.xadd(_keys.input_stream(left[0]), ENTRY)
    await r.xadd(_keys.dead_letter_stream(left[1]), {**ENTRY, "_reason": "r"})
    config = lbs.Config(max_streams=3, read_block=0.1, drain_timeout=0.0)
    consumer = lbs.ShardedClient(
        url, service, "w1", config, shards=3, load_entrypoint_plugins=False
    )
    await consumer.start()
    try:

        async def one_each() -> bool:
            sh = await collect_shards(url, service, 3)
            return [(s.status.pending, s.status.count("alive")) for s in sh.shards] == [(1, 1)] * 3

        await eventually(one_each)
        result = await invoke(
            "status", service, "--shards", "3", "--previous-shards", "2", "--url", url, "--json"
        )
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        assert (doc["cluster"], doc["masters"], doc["balanced"]) == (False, {here: 3}, True)
        assert doc["previous_shards"] == [2]
        rows = {r["name"]: r for r in doc["shards"]}
        assert list(rows) == [*names, *left]
        for name in names:
            row = rows[name]
            assert (row["legacy"], row["node"], row["slot"]) == (False, here, slot_of(name))
            st = row["status"]
            assert (st["backlog"], st["pending"], st["consumer_states"]["alive"]) == (1, 1, 1)
        busy, empty = rows[left[0]], rows[left[1]]
        assert busy["legacy"] and busy["why"] == "shard 0 of the 2-shard layout being left"
        assert (busy["status"]["backlog"], busy["empty"]) == (1, False)
        assert (empty["status"]["dead_letters"], empty["empty"]) == (1, True)

        result = await invoke(
            "status", service, "--shards", "3", "--previous-shards", "2", "--url", url
        )
        screen = flat(result.stdout)
        assert result.exit_code == 0 and "single Redis" in screen
        for name in names:
            assert f"{name} {slot_of(name)} {here} 1 1 1 alive 0" in screen
        stream = _keys.input_stream(left[1])
        assert f"legacy {left[0]} (shard 0 of the 2-shard layout being left): holds work" in screen
        assert f"empty; delete {stream} and {{{stream}}}:* (its 1 dead letters with them)" in screen
        assert f"shards per master: {here} 3" in screen
    finally:
        await consumer.close()


async def test_no_shard_of_the_service_exits_1(redis_server: Any, service: str) -> None:
    result = await invoke("status", service, "--shards", "4", "--url", redis_server.url)
    assert result.exit_code == 1
    assert f"no shard of service {service!r} in 4 shards exists" in flat(result.stderr)
    result = await invoke("status", service, "--shards", "0", "--url", redis_server.url)
    assert result.exit_code == 2


async def test_watch_redraws_the_shards(redis_server: Any, service: str) -> None:
    for name in _keys.shard_services(service, 2):
        await produce(redis_server.url, name, "a")
    argv = app_argv(
        "status", service, "--shards", "2", "--url", redis_server.url, "-w", "-n", "0.2"
    )
    title = f"lbs status {service} · 2 shards"
    screen, code = await watched(argv, lambda s: s.count(title) >= 2, cols=200)
    assert "shards per master:" in screen
    assert code == 0


def test_uneven_masters_are_named_with_the_fix() -> None:
    sh = ShardedStatus("orders", 6, (), True, (), {"a:1": 4, "b:1": 1, "c:1": 1})
    assert not sh.balanced and sh.to_dict()["balanced"] is False
    console = Console(width=200, record=True)
    console.print(render_shards(sh))
    screen = flat(console.export_text())
    assert "shards per master: a:1 4, b:1 1, c:1 1" in screen
    assert "uneven: the 3 masters own 4, 1, 1 of the 6 shards" in screen
    assert "CLUSTER SETSLOT" in screen and "redis-cli --cluster rebalance" in screen
    even = ShardedStatus("orders", 4, (), True, (), {"a:1": 2, "b:1": 1, "c:1": 1})
    assert even.balanced
