"""How the Spark source packs stream ranges into partitions, and when a pattern is scanned again."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

from lbs.spark._plan import Discovery, Ranges, pack


def _streams(parts: list[Ranges]) -> list[list[str]]:
    return [[stream for stream, _, _ in p.ranges] for p in parts]


def test_small_streams_share_a_partition_up_to_the_target_and_a_big_one_is_alone() -> None:
    ranges = [("a", "-", "1-0", 400), ("b", "-", "2-0", 500), ("c", "-", "3-0", 5_000)]
    ranges += [("d", "-", "4-0", 100), ("e", "-", "5-0", 0), ("f", "-", "6-0", 950)]
    parts = pack(ranges, lambda s: "", 1_000)
    assert _streams(parts) == [["a", "b"], ["c"], ["d", "e"], ["f"]]
    assert parts[0].ranges == (("a", "-", "1-0"), ("b", "-", "2-0"))


def test_a_partition_holds_the_streams_of_one_node() -> None:
    ranges = [(name, "-", "1-0", 1) for name in "abcdef"]
    parts = pack(ranges, lambda s: "n1" if s in "ace" else "n2", 1_000)
    assert _streams(parts) == [["a", "c", "e"], ["b", "d", "f"]]


def test_a_stream_counts_at_least_one_entry() -> None:
    parts = pack([(str(i), "-", "1-0", 0) for i in range(10)], lambda s: "", 4)
    assert [len(p.ranges) for p in parts] == [4, 4, 2]


def test_the_pattern_is_scanned_at_first_and_then_once_a_refresh() -> None:
    now = [100.0]
    scans: list[Any] = []

    def scan(client: Any) -> list[str]:
        scans.append(client)
        return [f"s{len(scans)}"]

    found = Discovery(scan, 60, clock=lambda: now[0])
    assert found.names("r") == ["s1"]
    now[0] += 59.9
    assert found.names("r") == ["s1"] and len(scans) == 1
    now[0] += 0.1
    assert found.names("r") == ["s2"]
    every = Discovery(scan, 0, clock=lambda: now[0])
    assert every.names("r") == ["s3"] and every.names("r") == ["s4"]
