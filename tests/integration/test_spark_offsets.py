"""The streaming reader's offsets without a Spark session: ``maxEntriesPerTrigger`` is a total over the
streams, and every stream gets its turn."""

from __future__ import annotations

from typing import Any

import pytest
import redis

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

from lbs.spark._readstream import LbsStreamReader


def _reader(url: str, streams: list[str], group: str, cap: int) -> Any:
    from pyspark.sql.types import StructType

    options = {"url": url, "streams": ",".join(streams), "group": group}
    options["maxEntriesPerTrigger"] = str(cap)
    return LbsStreamReader(options, StructType())


def _between(r: redis.Redis, start: dict[str, str], end: dict[str, str]) -> dict[str, int]:
    return {n: len(r.xrange(n, "(" + start[n], end[n])) for n in end if end[n] != start[n]}


@pytest.mark.parametrize(("streams", "cap"), [(10, 7), (3, 100), (4, 10)])
def test_max_entries_per_trigger_is_a_total_over_the_streams(
    redis_server: Any, service: str, streams: int, cap: int
) -> None:
    names = [f"{service}-s{i}" for i in range(streams)]
    with redis.Redis.from_url(redis_server.url) as r:
        pipe = r.pipeline(transaction=False)
        for i, name in enumerate(names):
            for n in range(5 + 10 * (i == 0)):  # the first stream has more than the others
                pipe.xadd(name, {"n": n})
        pipe.execute()
        total = sum(r.xlen(n) for n in names)
        reader = _reader(redis_server.url, names, f"{service}-g", cap)
        try:
            start = reader.initialOffset()
            taken: dict[str, int] = {}
            while True:
                end = reader.latestOffset(start, None)
                got = _between(r, start, end)
                if not got:
                    break
                assert sum(got.values()) == min(cap, total - sum(taken.values()))
                for n, k in got.items():
                    taken[n] = taken.get(n, 0) + k
                start = end
        finally:
            reader.stop()
        assert taken == {n: r.xlen(n) for n in names}  # every entry, each stream in its turn
