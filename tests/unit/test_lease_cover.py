"""Heartbeat.cover: a take is under the local lease from its write's send time; a reply read too late
is refused, one read near the lease's end gets a tick at once (logic only: the real-server tests are
tests/faults/test_faults_frozen.py and test_faults_deploy.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from lbs._consumer.finisher import Finisher
from lbs._consumer.heartbeat import Heartbeat
from lbs._consumer.requeue import Requeue
from lbs._consumer.topology import Topology
from lbs.config import Config

from _fakewire import FakeRedis, Harness


@pytest.fixture
async def beat(fake: FakeRedis) -> AsyncIterator[Heartbeat]:
    h = Harness(fake, Config(lock_ttl=3.0))  # lease 2.85 s, a tick every 1 s, min_left 0.25 s
    topology = Topology(h.state, None)
    hb = Heartbeat(h.state, Finisher(h.state, topology), Requeue(h.state), topology)
    yield hb
    await hb.stop()


async def test_a_take_sent_now_is_covered_and_changes_nothing(beat: Heartbeat) -> None:
    before = beat.lease_until
    assert beat.cover(time.monotonic())
    assert beat.lease_until == before  # its lease ends after the last tick's
    assert not beat.tick_now.is_set()


async def test_a_reply_read_after_its_lease_is_refused(beat: Heartbeat) -> None:
    before = beat.lease_until
    sent = time.monotonic() - 2.85  # the write went out a lease ago: the locks may be gone
    assert not beat.cover(sent)
    assert not beat.cover(sent + beat.min_left() - 0.01)  # less than min_left left
    assert beat.lease_until == before  # refused: nothing changed


async def test_an_older_take_shortens_the_lease_and_asks_for_a_tick(beat: Heartbeat) -> None:
    beat.next_tick = time.monotonic() + 1.0  # the next tick, an interval away
    sent = time.monotonic() - 2.0  # 0.85 s of lease left: less than the next tick + min_left
    assert beat.cover(sent)
    assert beat.lease_until == pytest.approx(sent + 2.85)
    assert beat.tick_now.is_set()  # the tick goes now


async def test_a_take_with_room_before_the_next_tick_waits_for_it(beat: Heartbeat) -> None:
    beat.lease_until = time.monotonic() + 2.85  # a tick just answered
    beat.next_tick = time.monotonic() + 1.0
    sent = time.monotonic() - 0.5  # 2.35 s left: the next tick extends its lock in time
    assert beat.cover(sent)
    assert beat.lease_until == pytest.approx(sent + 2.85)
    assert not beat.tick_now.is_set()
