"""Shard placement (lbs._placement): a sharded service's shards spread evenly over the slot space, so
masters owning equal slot ranges carry exactly N / M shards each, whatever the service's name."""

from __future__ import annotations

import random
import string
from collections import Counter

import pytest

import lbs
from lbs._placement import SLOTS, legacy_names, shard_name, shard_range, slot_of


def redis_cli_ranges(masters: int) -> list[tuple[int, int]]:
    """The slot ranges ``redis-cli --cluster create`` gives ``masters`` masters (its rounding)."""
    per = SLOTS / masters
    out, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = round(cursor + per - 1)
        if last > SLOTS or i == masters - 1:
            last = SLOTS - 1
        last = max(last, first)
        out.append((first, last))
        first, cursor = last + 1, cursor + per
    return out


def even_ranges(masters: int) -> list[tuple[int, int]]:
    """The ranges lbs.embedded's cluster gives: ``[k x 16384 // M, (k + 1) x 16384 // M)``."""
    return [(k * SLOTS // masters, (k + 1) * SLOTS // masters - 1) for k in range(masters)]


def owner(ranges: list[tuple[int, int]], slot: int) -> int:
    return next(k for k, (first, last) in enumerate(ranges) if first <= slot <= last)


def names(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    shapes = [
        lambda: f"orders-{rng.randrange(100_000)}",
        lambda: "".join(rng.choices(string.ascii_lowercase + "-_.", k=rng.randrange(1, 24))),
        lambda: f"svc{rng.randrange(10_000)}.eu-west",
    ]
    return [rng.choice(shapes)() for _ in range(n)]


@pytest.mark.parametrize("masters", [3, 6, 8])
@pytest.mark.parametrize("per_master", [1, 2])
@pytest.mark.parametrize("layout", [redis_cli_ranges, even_ranges])
def test_every_master_gets_exactly_n_over_m_shards(masters: int, per_master: int, layout) -> None:  # type: ignore[no-untyped-def]
    ranges = layout(masters)
    shards = masters * per_master
    for service in names(120, seed=masters * 100 + per_master):
        counts = Counter(owner(ranges, slot_of(s)) for s in lbs.shard_services(service, shards))
        assert [counts[k] for k in range(masters)] == [per_master] * masters, (service, counts)


@pytest.mark.parametrize(("masters", "shards"), [(3, 4), (3, 5), (6, 8), (8, 12), (5, 16)])
@pytest.mark.parametrize("layout", [redis_cli_ranges, even_ranges])
def test_otherwise_each_master_gets_n_over_m_rounded(masters: int, shards: int, layout) -> None:  # type: ignore[no-untyped-def]
    ranges = layout(masters)
    low, high = shards // masters, -(-shards // masters)
    for service in names(60, seed=shards):
        counts = Counter(owner(ranges, slot_of(s)) for s in lbs.shard_services(service, shards))
        assert all(low <= counts[k] <= high for k in range(masters)), (service, counts)


def test_the_names_are_fixed_by_the_documented_algorithm() -> None:
    """Pinned: another client computing the names from the docs must get these."""
    assert lbs.shard_services("orders", 1) == ["orders"]
    assert lbs.shard_services("orders", 3) == ["orders.0~2319", "orders.1~118", "orders.2~397"]
    for i, name in enumerate(lbs.shard_services("payments", 16)):
        lo, hi = shard_range(i, 16)
        assert lo <= slot_of(name) < hi
        assert name == f"payments.{i}" or name.startswith(f"payments.{i}~")


def test_shard_windows_are_apart_and_in_the_middle_of_their_range() -> None:
    for n in (2, 3, 7, 64, 4096, SLOTS):
        prev = 0
        for i in range(n):
            lo, hi = shard_range(i, n)
            assert prev <= lo < hi <= SLOTS
            assert i * SLOTS // n <= lo and hi <= (i + 1) * SLOTS // n + 1
            prev = hi
    assert shard_range(0, 3) == (2722, 2739)


def test_legacy_names_are_the_shards_that_moved() -> None:
    assert legacy_names("orders", 1) == []
    assert legacy_names("orders", 3) == ["orders.0", "orders.1", "orders.2"]
    for service in names(20, seed=1):
        moved = set(legacy_names(service, 6))
        now = set(lbs.shard_services(service, 6))
        assert not moved & now
        assert len(moved) + len([s for s in now if "~" not in s.rsplit(".", 1)[-1]]) == 6


def test_a_shard_count_past_the_slots_is_refused() -> None:
    with pytest.raises(lbs.ConfigurationError, match="from 1 to 16384"):
        lbs.shard_services("orders", SLOTS + 1)
    assert len(shard_name("orders", 5, 4096)) > 0
