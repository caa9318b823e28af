"""Heartbeat.cover: a take may start while the local lease (the last confirmed tick's send time plus the
lease TTL, less a margin) has at least ``min_left`` to run; a reply read too late is refused (logic only:
the real-server tests are tests/faults/test_faults_frozen.py and test_faults_deploy.py)."""

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


async def test_a_take_under_a_fresh_lease_is_covered_and_changes_nothing(beat: Heartbeat) -> None:
    before = beat.lease_until
    assert beat.cover(time.monotonic())
    assert beat.cover(time.monotonic() - 10.0)  # the lease, not the write's age, decides
    assert beat.lease_until == before


async def test_a_reply_read_after_the_local_lease_is_refused(beat: Heartbeat) -> None:
    beat.lease_until = time.monotonic() - 0.01  # no tick confirmed the lease for a TTL
    assert not beat.cover(time.monotonic())


async def test_a_reply_read_with_less_than_min_left_of_lease_is_refused(beat: Heartbeat) -> None:
    beat.lease_until = time.monotonic() + beat.min_left() - 0.05
    assert not beat.cover(time.monotonic())
    beat.lease_until = time.monotonic() + beat.min_left() + 0.5
    assert beat.cover(time.monotonic())
