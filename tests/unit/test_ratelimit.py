"""The rate limit's arithmetic (:mod:`lbs._consumer.ratelimit`): windows, allowances, grants, slices;
and its settings (``Config.rate_limit``, ``Config.rate_limit_window``)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from redis.crc import key_slot

import lbs
from lbs import _keys
from lbs._consumer.ratelimit import (
    BLOCKING_ASK,
    RateLimiter,
    Windows,
    allowance,
    fair_slice,
    granted,
)


@pytest.mark.parametrize(
    ("rate", "window"), [(20, 1.0), (20, 0.1), (0.5, 1.0), (3, 0.25), (1 / 60, 1.0), (7.3, 0.05)]
)
def test_windows_give_the_rate_exactly_over_time(rate: float, window: float) -> None:
    w = Windows.of(rate, window)
    for start in (0, 1_700_000_000_000 // w.window_ms):  # from 0, and at today's window numbers
        n = 1000
        given = [w.allowance(k) for k in range(start, start + n)]
        # Never more than the burst, and together what the rate gives over the span (within one).
        assert max(given) <= w.burst() == math.ceil(rate * window - 1e-9)
        assert abs(sum(given) - rate * window * n) <= 1
        # Any run of consecutive windows gives at most its share rounded up.
        for length in (1, 2, 7):
            for i in range(0, n - length, 13):
                assert sum(given[i : i + length]) <= math.ceil(rate * window * length - 1e-9)


def test_a_window_number_is_the_server_time_in_windows() -> None:
    w = Windows.of(20, 0.1)
    assert w.window_ms == 100
    assert w.number(1_000) == 10 and w.number(1_099.9) == 10 and w.number(1_100) == 11
    assert w.left_ms(1_030) == 70
    assert w.ttl_ms() > 2 * w.window_ms  # the next window's asks still find it


def test_allowance_spreads_a_fraction() -> None:
    # A quarter of an assignment per window: one every fourth window.
    assert [allowance(k, 250_000) for k in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]
    assert [allowance(k, 2_000_000) for k in range(3)] == [2, 2, 2]


@pytest.mark.parametrize(
    ("after", "asked", "allow", "expected"),
    [
        (5, 5, 20, 5),  # the first ask of a window
        (20, 5, 20, 5),  # fills it exactly
        (22, 5, 20, 3),  # what was left
        (25, 5, 20, 0),  # full
        (40, 5, 20, 0),  # full, over-counted by asks that found it full
        (3, 5, 20, 5),  # a give-back of 2 came with it (HINCRBY 5 - 2)
        (0, 0, 20, 0),
    ],
)
def test_a_grant_is_what_fit_before_the_ask(
    after: int, asked: int, allow: int, expected: int
) -> None:
    assert granted(after, asked, allow) == expected


def test_grants_never_exceed_the_allowance_whatever_the_order() -> None:
    allow, count = 20, 0
    total = 0
    for ask in (7, 7, 7, 7, 3, 50, 1):
        count += ask
        total += granted(count, ask, allow)
    assert total == allow


@pytest.mark.parametrize(
    ("allow", "askers", "expected"), [(20, 1, 20), (20, 3, 7), (20, 40, 1), (0, 3, 1), (5, 0, 5)]
)
def test_a_fair_slice_is_the_allowance_split_rounded_up(
    allow: int, askers: int, expected: int
) -> None:
    assert fair_slice(allow, askers) == expected


def _limiter(rate: float, window: float) -> RateLimiter:
    config = lbs.Config(rate_limit=rate, rate_limit_window=window)
    state: Any = SimpleNamespace(config=config, names=SimpleNamespace(service="svc", id="c1"))
    return RateLimiter(state)


def test_an_ask_is_at_most_a_slice_in_the_first_half_and_what_fits_after() -> None:
    limiter = _limiter(20, 1.0)  # windows of 1 s giving 20 each; nobody else seen yet
    k = 1_000
    start = k * 1000
    assert limiter.ask_for(50, k, start + 10, blocking=False) == 20
    assert limiter.ask_for(50, k, start + 10, blocking=True) == BLOCKING_ASK
    assert limiter.ask_for(5, k, start + 10, blocking=False) == 5
    assert limiter.ask_for(50, k, start + 600, blocking=False) == 50  # second half: all it can take


def test_the_key_shares_the_services_slot() -> None:
    assert _keys.rate_prefix("svc") == "{svc-input}:rate:"
    assert key_slot(b"{svc-input}:rate:12345") == key_slot(lbs.input_stream("svc").encode())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rate_limit": 0}, "Config.rate_limit must be a positive number"),
        ({"rate_limit": -1.0}, "Config.rate_limit must be a positive number"),
        ({"rate_limit": math.inf}, "Config.rate_limit must be a positive number"),
        ({"rate_limit": math.nan}, "Config.rate_limit must be a positive number"),
        ({"rate_limit": True}, "Config.rate_limit must be a positive number"),
        ({"rate_limit": "10/m"}, r"e\.g\. 10/minute is rate_limit=10 / 60"),
        ({"rate_limit_window": 0}, "Config.rate_limit_window must be a number of seconds"),
        ({"rate_limit_window": 0.001}, "from 0.01 to 3600"),
        ({"rate_limit_window": 7200}, "from 0.01 to 3600, got 7200"),
        ({"rate_limit_window": None}, "Config.rate_limit_window"),
    ],
)
def test_bad_rate_limits_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(lbs.ConfigurationError, match=message):
        lbs.Config(**changes)


def test_rate_limit_settings_and_their_typos() -> None:
    config = lbs.Config(rate_limit=20, rate_limit_window=0.1)
    assert config.rate_limit == 20 and config.rate_limit_window == 0.1
    assert lbs.Config().rate_limit is None and lbs.Config().rate_limit_window == 1.0
    with pytest.raises(lbs.ConfigurationError, match="did you mean 'rate_limit'"):
        lbs.Config(ratelimit=20)
    with pytest.raises(lbs.ConfigurationError, match="did you mean 'rate_limit_window'"):
        lbs.Config(rate_limit_windows=1.0)


def test_the_worker_reads_the_rate_limit_from_the_environment_and_set() -> None:
    from lbs.cli.settings import resolve_config

    config, _ = resolve_config(None, {"LBS_RATE_LIMIT": "12.5"}, ["rate_limit_window=0.5"], {})
    assert config.rate_limit == 12.5 and config.rate_limit_window == 0.5
    config, _ = resolve_config(None, {"LBS_RATE_LIMIT": "none"}, [], {})
    assert config.rate_limit is None
    with pytest.raises(lbs.ConfigurationError, match="LBS_RATE_LIMIT"):
        resolve_config(None, {"LBS_RATE_LIMIT": "10/s"}, [], {})
