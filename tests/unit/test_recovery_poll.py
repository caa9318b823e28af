"""When the deadline poller polls next: at the earliest deadline, within its floor and its keep-alive."""

from __future__ import annotations

import pytest

import lbs
from lbs._consumer.recovery import poll_wait


@pytest.mark.parametrize(
    "due, expected",
    [
        (None, 2.5),  # the index empty: the keep-alive
        (60.0, 2.5),  # the earliest deadline far off: the keep-alive
        (1.0, 1.002),  # at the earliest deadline, a few ms late
        (0.1, 0.25),  # never twice within the interval
        (0.0, 0.25),
    ],
)
def test_the_poller_sleeps_until_the_earliest_deadline_within_its_bounds(
    due: float | None, expected: float
) -> None:
    assert poll_wait(due, 0.25, 2.5) == pytest.approx(expected)


def test_a_poller_turned_off_with_a_huge_interval_stays_off() -> None:
    assert poll_wait(None, 3600.0, 1800.0) == 3600.0
    assert poll_wait(0.5, 3600.0, 1800.0) == 3600.0


@pytest.mark.parametrize(
    "ttl, interval, stall_ms",
    [(10.0, 0.25, 5000), (1.0, 0.1, 1000), (60.0, 0.25, 30000), (10.0, 3600.0, 14_400_000)],
)
def test_the_stall_threshold_is_half_a_ttl_at_least_a_second_and_four_intervals(
    ttl: float, interval: float, stall_ms: int
) -> None:
    """An idle poller calls every half of it (2.5 s by default), never less often than its interval."""
    cfg = lbs.Config(lock_ttl=ttl, deadline_poll_interval=interval)
    client = lbs.Client("redis://127.0.0.1:1", "svc", "c1", cfg, load_entrypoint_plugins=False)
    assert client.recovery.stall_ms() == stall_ms
    assert stall_ms / 2000 >= 2 * interval
