"""Lingering.worth: keys linger while enough of those that lingered came back in time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lbs._consumer.linger import PROBE, WINDOW, WORTH, Lingering


def lingering() -> Lingering:
    state: Any = SimpleNamespace(names=SimpleNamespace(key_prefix="{s-input}:", id="c1"))
    return Lingering(state, 5.0, lambda hold: None, lambda hold: None)


def test_keys_linger_until_there_are_enough_endings_to_tell() -> None:
    ling = lingering()
    for _ in range(PROBE - 1):
        ling.count(False)
    assert ling.worth()


def test_keys_that_never_come_back_stop_lingering_but_one_in_probe_still_does() -> None:
    ling = lingering()
    for _ in range(50):
        ling.count(False)
    asked = [ling.worth() for _ in range(10 * PROBE)]
    assert asked.count(True) == 10  # one in PROBE, to keep the count current


def test_keys_that_come_back_often_enough_linger() -> None:
    ling = lingering()
    for i in range(100):
        ling.count(i % 3 != 0)  # two thirds woken: above WORTH
    assert WORTH < 2 / 3 and all(ling.worth() for _ in range(20))


def test_the_count_follows_the_recent_keys() -> None:
    """After a run of keys that never came back, keys that do make lingering worth it again."""
    ling = lingering()
    for _ in range(WINDOW):
        ling.count(False)
    assert not all(ling.worth() for _ in range(PROBE))
    for _ in range(WINDOW):
        ling.count(True)
    assert ling.worth() and ling.ended < WINDOW
