"""The Lua-free heartbeat tick's and pollers' look's readers (pure logic; the commands run against real
servers in tests/integration/test_lease.py and test_recovery_idle.py)."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from lbs._redis.beat import tick_notes
from lbs._redis.clock import ServerClock
from lbs._redis.peek import peek_reply


def test_the_server_clock_pins_time_to_the_middle_of_its_round_trip() -> None:
    clock = ServerClock()
    assert clock.now_ms(5.0) is None
    assert clock.note([b"1700000000", b"250000"], sent=10.0, received=10.2)
    assert clock.now_ms(10.1) == 1_700_000_000_250
    assert clock.now_ms(13.1) == 1_700_000_003_250
    assert not clock.note(ResponseError("NOPERM"), sent=11.0, received=11.1)
    assert not clock.note(None, sent=11.0, received=11.1)
    assert clock.now_ms(13.1) == 1_700_000_003_250  # a bad reply leaves the last one


def test_a_tick_reads_its_lease_as_extend_n_does() -> None:
    queued = [b"OK", b"QUEUED", b"QUEUED", b"QUEUED"]
    now = [b"1", b"0"]
    assert tick_notes([*queued, [b"v1", 0, now]], "v1", "d") == ([], now)
    assert tick_notes([*queued, [None, 1, now]], "v1", "d")[0] == ["LEASE "]
    assert tick_notes([*queued, [b"v2", 0, now]], "v1", "d")[0] == ["LEASE v2"]
    wrong = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    notes, _ = tick_notes([*queued, [wrong, wrong, now]], "v1", "d")
    assert notes[0].startswith("LEASE WRONGTYPE") and notes[1].startswith("LBSKEY d:")
    with pytest.raises(ResponseError, match="NOPERM"):
        tick_notes([b"OK", ResponseError("NOPERM zadd"), b"QUEUED", b"QUEUED", None], "v1", "d")
    with pytest.raises(TypeError):
        tick_notes([*queued, None], "v1", "d")


def test_a_peek_reads_time_values_and_heads() -> None:
    look = peek_reply([[b"100", b"500000"], b"99000", [b"c1", b"100750"], []], zsets=2, gets=1)
    assert (look.now_ms, look.values, look.heads) == (100_500, (b"99000",), (100_750.0, None))
    assert look.due_in() == pytest.approx(0.25)
    due = peek_reply([[b"100", b"0"], [b"c1", b"99000"]], zsets=1)
    assert due.due_in() == 0
    assert peek_reply([[b"100", b"0"], [], []], zsets=2).due_in() is None
    assert peek_reply([[b"100", b"0"], [b"x", b"inf"]], zsets=1).due_in() == float("inf")
    assert peek_reply([[b"100", b"0"], [[b"c1", 100_250.0]]], zsets=1).heads == (
        100_250.0,
    )  # RESP3
    with pytest.raises(ResponseError):
        peek_reply([[b"100", b"0"], ResponseError("WRONGTYPE")], zsets=1)
    with pytest.raises(ValueError):
        peek_reply([[b"100", b"0"]], zsets=1)
