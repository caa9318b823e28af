"""The overview of a sharded service (``lbs dashboard --shards N``, issue 48): each shard's slot, the
master owning it and its counts, the legacy shards that still exist flagged, the shards per master."""

from __future__ import annotations

import re
from typing import Any

import pytest

from lbs import _keys
from lbs._placement import legacy_names, slot_of

from _helpers import produce

pytestmark = pytest.mark.integration


def cells(row: str) -> dict[str, str]:
    """A shard row's cells by their ``data-col``."""
    return dict(re.findall(r'data-col="([a-z_]+)">([^<]*)<', row))


async def test_the_overview_shows_each_shards_slot_and_master(
    redis_cluster: Any, service: str, dashboard: Any
) -> None:
    url = "redis+cluster://" + redis_cluster.url.split("://", 1)[1]
    names = _keys.shard_services(service, 3)
    for i, name in enumerate(names):  # shard i holds i + 1 registrations
        await produce(url, name, *[f"s{j}" for j in range(i + 1)])
    old = legacy_names(service, 3)[0]  # an earlier lbs's shard with work left in it
    cluster = redis_cluster.client()
    try:
        cluster.xadd(_keys.input_stream(old), {"lbs-input": '{"DataStreamName":"x","Info":{}}'})
        owner = {n: cluster.get_node_from_key(_keys.input_stream(n)).name for n in [*names, old]}
        primaries = {node.name for node in cluster.get_primaries()}
    finally:
        cluster.close()
    async with dashboard(url, [service], shards=3) as (http, _):
        response = await http.get("/")
    assert response.status_code == 200, response.text
    page = response.text
    rows = re.findall(r'<tr data-shard="([^"]+)"( data-legacy)?>(.*?)</tr>', page, re.S)
    assert [(name, bool(flag)) for name, flag, _ in rows] == [
        *((n, False) for n in names),
        (old, True),
    ]
    for i, (name, _, row) in enumerate(rows):
        got = cells(row)
        assert (got["slot"], got["node"]) == (str(slot_of(name)), owner[name])
        assert got["waiting"] == str(i + 1 if name != old else 1)
        assert (got["held"], got["dead_letters"]) == ("0", "0")
    legacy_row = rows[-1][2]
    assert ">legacy<" in legacy_row and "holds work" in legacy_row
    assert f'href="/s/{old}/' not in legacy_row  # not a shard of the dashboard: no page of its own
    masters = dict(re.findall(r'data-master="([^"]+)">[^<]*<b>(\d+)</b>', page))
    assert masters == dict.fromkeys(primaries, "1") and "data-uneven" not in page
    for name in names:  # each shard its own card, its slot in its header
        assert f'id="svc-{name}"' in page and f"· slot {slot_of(name)}</span>" in page
    assert f'id="svc-{old}"' not in page


async def test_an_unsharded_overview_has_no_shard_table(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    await produce(redis_server.url, service, "a")
    async with dashboard(redis_server.url, [service]) as (http, _):
        page = (await http.get("/")).text
    assert f'id="svc-{service}"' in page and "data-shard=" not in page
