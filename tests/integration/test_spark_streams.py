"""The readers over many streams, without a Spark session (the planning runs in the driver): small
streams share partitions, a quiet trigger asks Redis a few questions instead of one a stream, a
pattern is scanned once a refresh, and a key that is not a stream is named."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

from lbs import ConfigurationError
from lbs.embedded import RedisServer
from lbs.spark._plan import Ranges
from lbs.spark._read import LbsReader, default_schema
from lbs.spark._readstream import LbsStreamReader


@pytest.fixture
def own() -> Iterator[RedisServer]:
    """A server of this test's own: its command counts are this test's alone."""
    with RedisServer() as server:
        yield server


def _seed(r: redis.Redis, names: list[str], each: int) -> None:
    pipe = r.pipeline(transaction=False)
    for name in names:
        for n in range(each):
            pipe.xadd(name, {"n": n})
    pipe.execute()


def _rows(reader: Any, parts: list[Any]) -> list[tuple[str, str]]:
    """Every (stream, id) the partitions give, read as an executor reads them."""
    out = []
    for part in parts:
        for batch in reader.read(part):
            out += list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
    return out


def _calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def test_small_streams_share_partitions_and_a_big_one_is_alone(own: RedisServer) -> None:
    small = [f"sess:{i:03}" for i in range(300)]
    with own.client() as r:
        _seed(r, small, 3)
        _seed(r, ["sess:big"], 1_500)
        expected = sorted(
            (name, i.decode()) for name in [*small, "sess:big"] for i, _ in r.xrange(name)
        )
    options = {"url": own.url, "pattern": "sess:*", "maxEntriesPerPartition": "500"}
    batch = LbsReader(options, default_schema())
    parts = batch.partitions()
    # 900 small entries in partitions of 500 at most (166 streams of 3), the big stream alone.
    assert sorted(len(p.ranges) for p in parts) == [1, 134, 166]
    assert sorted(_rows(batch, parts)) == expected
    stream = LbsStreamReader({**options, "group": "g"}, default_schema())
    try:
        start = stream.initialOffset()
        parts = list(stream.partitions(start, stream.latestOffset(start, None)))
        assert sorted(len(p.ranges) for p in parts) == [1, 134, 166]
        assert all(isinstance(p, Ranges) for p in parts)
        assert sorted(_rows(stream, parts)) == expected
    finally:
        stream.stop()


def test_a_quiet_trigger_asks_a_few_questions_not_one_a_stream(own: RedisServer) -> None:
    names = [f"sess:{i:04}" for i in range(2_500)]
    with own.client() as r:
        _seed(r, names, 2)
        reader = LbsStreamReader(
            {"url": own.url, "pattern": "sess:*", "group": "g"}, default_schema()
        )
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, None)
            parts = reader.partitions(start, end)
            assert len(parts) == 1 and len(_rows(reader, list(parts))) == 5_000
            reader.commit(end)
            r.config_resetstat()
            assert reader.latestOffset(end, None) == end  # nothing moved
            calls = _calls(r)
            # One multi-stream XREAD per 1,000 streams; no SCAN (within patternRefreshSeconds),
            # no per-stream read.
            assert calls.get("xread") == 3 and "scan" not in calls and "xrevrange" not in calls
            # A stream with a few new entries is planned from that look alone; one with more than
            # it reads (10) is asked its newest id and length.
            _seed(r, [names[7]], 3)
            _seed(r, [names[8]], 12)
            r.config_resetstat()
            later = reader.latestOffset(end, None)
            assert {k for k in later if later[k] != end[k]} == {names[7], names[8]}
            calls = _calls(r)
            assert calls.get("xread") == 3 and calls.get("xrevrange") == calls.get("xlen") == 1
            assert later[names[8]] == r.xrevrange(names[8], count=1)[0][0].decode()
            (part,) = reader.partitions(end, later)
            assert [s for s, _, _ in part.ranges] == [names[7], names[8]]
            assert len(_rows(reader, [part])) == 15
            reader.commit(later)
            assert r.xpending(names[7], "g")["pending"] == r.xpending(names[8], "g")["pending"] == 0
        finally:
            reader.stop()


@pytest.mark.parametrize(("refresh", "seen"), [("0", True), ("3600", False)])
def test_the_pattern_finds_a_new_stream_at_its_next_scan(
    own: RedisServer, refresh: str, seen: bool
) -> None:
    with own.client() as r:
        _seed(r, ["sess:a"], 1)
        reader = LbsStreamReader(
            {"url": own.url, "pattern": "sess:*", "group": "g", "patternRefreshSeconds": refresh},
            default_schema(),
        )
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, None)
            _seed(r, ["sess:b"], 2)
            later = reader.latestOffset(end, None)
            assert ("sess:b" in later) is seen
            if seen:  # a stream found later is read whole, through the query's group
                (part,) = reader.partitions(end, later)
                assert len(_rows(reader, [part])) == 2
        finally:
            reader.stop()


def test_a_key_that_is_not_a_stream_is_named(own: RedisServer) -> None:
    with own.client() as r:
        _seed(r, ["sess:a", "sess:b"], 1)
        r.set("sess:text", "x")
        options = {"url": own.url, "streams": "sess:a,sess:text", "group": "g"}
        wrong = LbsStreamReader(options, default_schema())
        with pytest.raises(ConfigurationError, match="'sess:text' is not a stream"):
            wrong.initialOffset()
        wrong.stop()
        reader = LbsStreamReader({**options, "streams": "sess:a,sess:b"}, default_schema())
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, None)
            r.delete("sess:b")
            r.set("sess:b", "x")  # replaced after the query started
            with pytest.raises(ConfigurationError, match="'sess:b' is not a stream"):
                reader.latestOffset(end, None)
        finally:
            reader.stop()


def test_a_commit_passes_over_a_deleted_stream_and_acknowledges_the_others(
    own: RedisServer,
) -> None:
    with own.client() as r:
        _seed(r, ["sess:a", "sess:b"], 3)
        reader = LbsStreamReader(
            {"url": own.url, "pattern": "sess:*", "group": "g"}, default_schema()
        )
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, None)
            assert len(_rows(reader, list(reader.partitions(start, end)))) == 6
            r.delete("sess:a")
            reader.commit(end)
            assert r.xpending("sess:b", "g")["pending"] == 0
        finally:
            reader.stop()


def test_the_streaming_plan_on_a_cluster(redis_cluster: Any) -> None:
    """Streams of three masters: the moved streams are asked per hash slot, a partition's streams
    live on one node."""
    names = [f"sess:{i}" for i in range(40)]
    client = redis.RedisCluster.from_url(redis_cluster.url)
    try:
        pipe = client.pipeline()
        for name in names:
            pipe.xadd(name, {"n": 1})
        pipe.execute()
        reader = LbsStreamReader(
            {"url": redis_cluster.url, "cluster": "oss", "pattern": "sess:*", "group": "g"},
            default_schema(),
        )
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, None)
            parts = list(reader.partitions(start, end))
            nodes = [{client.get_node_from_key(s).name for s, _, _ in p.ranges} for p in parts]
            assert len(parts) == 3 and all(len(n) == 1 for n in nodes)
            assert sorted(s for s, _ in _rows(reader, parts)) == sorted(names)
            reader.commit(end)
            assert reader.latestOffset(end, None) == end
        finally:
            reader.stop()
        client.delete(*names)
    finally:
        client.close()
