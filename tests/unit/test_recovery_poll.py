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
    "ttl, interval, keep_alive",
    [(10.0, 0.25, 2.5), (1.0, 0.1, 0.5), (60.0, 0.25, 15.0), (10.0, 3600.0, 7200.0)],
)
def test_an_idle_poller_calls_within_half_the_gap_its_stall_test_allows(
    ttl: float, interval: float, keep_alive: float
) -> None:
    cfg = lbs.Config(lock_ttl=ttl, deadline_poll_interval=interval)
    client = lbs.Client("redis://127.0.0.1:1", "svc", "c1", cfg, load_entrypoint_plugins=False)
    recovery = client.recovery
    assert recovery.keep_alive() == pytest.approx(keep_alive)
    assert recovery.keep_alive() * 1000 <= recovery.stall_ms() / 2
