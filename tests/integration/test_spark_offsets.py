"""The streaming reader's offsets without a Spark session: ``maxEntriesPerTrigger`` is a total over the
streams, and every stream gets its turn."""

from __future__ import annotations

from typing import Any

import pytest
import redis

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

from pyspark.sql.types import StructType

from lbs.spark._readstream import LbsStreamReader


def _reader(url: str, streams: list[str], group: str, cap: int) -> Any:
    from pyspark.sql.types import StructType

    options = {"url": url, "streams": ",".join(streams), "group": group}
    options["maxEntriesPerTrigger"] = str(cap)
    return LbsStreamReader(options, StructType())


def _between(r: redis.Redis, start: dict[str, str], end: dict[str, str]) -> dict[str, int]:
    first = {n: start.get(n, "0-0") for n in end}
    return {n: len(r.xrange(n, "(" + first[n], end[n])) for n in end if end[n] != first[n]}


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


def test_available_now_reads_what_was_there_at_its_start_in_batches_of_the_cap(
    redis_server: Any, service: str
) -> None:
    """Trigger.AvailableNow (PySpark >= 4.2 asks the source for its end first): batches of at most
    the cap up to each stream's newest entry at the start, then an end equal to the start (Spark
    stops); what comes later, in a known stream or a new one, waits for the next run."""
    names = [f"{service}-s{i}" for i in range(3)]
    with redis.Redis.from_url(redis_server.url) as r:
        pipe = r.pipeline(transaction=False)
        for i, name in enumerate(names):
            for n in range(4 + 6 * i):
                pipe.xadd(name, {"n": n})
        pipe.execute()
        there = {n: r.xlen(n) for n in names}
        options = {"url": redis_server.url, "pattern": f"{service}-s*", "group": "g"}
        options["patternRefreshSeconds"] = "0"  # the new stream is found, and left for later
        reader = LbsStreamReader({**options, "maxEntriesPerTrigger": "5"}, StructType())
        try:
            start = reader.initialOffset()
            reader.prepareForTriggerAvailableNow()
            later = [*names, f"{service}-s9"]
            for name in later:  # after the start: not this run's
                r.xadd(name, {"n": "late"})
            taken: dict[str, int] = {}
            batches = 0
            while (end := reader.latestOffset(start, None)) != start:
                got = _between(r, start, end)
                assert 0 < sum(got.values()) <= 5
                for n, k in got.items():
                    taken[n] = taken.get(n, 0) + k
                start, batches = end, batches + 1
            assert taken == there and batches == 6  # 4 + 10 + 16 = 30 entries, 5 a batch
        finally:
            reader.stop()
