"""One value the core cannot encode inside a batched call fails its own entry, never its neighbours.

The entry judge keeps a name UTF-8 cannot encode (a lone surrogate) out of every held stream
(tests/integration/test_bad_names.py); these check the second wall, on a fake wire, with a held
record built by hand: the finisher's ``done-n.lua`` call and a batch of ``requeue-6.lua`` calls set
such an entry aside, fail it alone with the reason, and send the others.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from _lbscore import Held
from lbs._consumer.finisher import Finisher
from lbs._consumer.requeue import NOT_SENT, Requeue
from lbs._consumer.topology import Topology
from lbs._redis.wire import sendable
from lbs._waits import within
from lbs.config import Config
from lbs.exceptions import DataError
from lbs.notifications import DoneStatus

from _fakewire import FakeRedis, Harness, eventually

BAD_NAME = "bad\ud800name"


def unencodable(h: Harness) -> Held:
    """A stream held under a name UTF-8 cannot encode (delivered under our lease as any other)."""
    x = h.take("placeholder")
    h.state.holdings.drop(x)
    bad = Held(x.entry_id, BAD_NAME, {}, 0, x.token, x.value, x.lock_key)
    h.state.holdings.table.add(bad)
    return bad


async def test_done_sets_an_unencodable_stream_aside_and_finishes_its_neighbours(
    fake: FakeRedis,
) -> None:
    h = Harness(fake)
    finisher = Finisher(h.state, Topology(h.state, None))
    try:
        a, bad, b = h.take("a"), unencodable(h), h.take("b")
        for x in (a, bad, b):
            h.state.holdings.drop(x)
        one, failed, two = await within(
            asyncio.gather(
                finisher.finish([a]),
                finisher.finish([bad]),
                finisher.finish([b]),
                return_exceptions=True,
            ),
            5,
        )
        assert one == two == [DoneStatus.DONE]
        assert isinstance(failed, DataError) and "bad\\ud800name" in str(failed)
        assert "surrogates not allowed" in str(failed)
        (call,) = fake.calls("XACKDEL")  # the neighbours, in one call
        assert call.args[4:] == [a.entry_id, b.entry_id]
        assert bad.entry_id in fake.pending  # untouched: recovered once the lease is gone
        assert h.metrics["done_failures_total"] == 1
        assert finisher.finishing() == []
    finally:
        await finisher.stop()


async def test_done_streams_with_one_unencodable_counts_the_others_and_raises(
    fake: FakeRedis,
) -> None:
    h = Harness(fake)
    finisher = Finisher(h.state, Topology(h.state, None))
    try:
        a, bad, b = h.take("a"), unencodable(h), h.take("b")
        for x in (a, bad, b):
            h.state.holdings.drop(x)
        with pytest.raises(DataError, match="cannot be sent to Redis"):
            await within(finisher.finish([a, bad, b]), 5)
        assert (h.state.stats.finished, h.state.stats.done) == (2, 2)
        assert [e["stream"] for e in h.recorder.of("lbs_lock_released")] == ["a", "b"]
        assert not fake.pending.keys() - {bad.entry_id}
    finally:
        await finisher.stop()


async def test_a_queued_unencodable_stream_is_logged_alone(
    fake: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(fake)
    finisher = Finisher(h.state, Topology(h.state, None))
    try:
        held = [h.take(f"s{i}") for i in range(5)]
        held.insert(2, unencodable(h))
        for x in held:
            h.state.holdings.drop(x)
            finisher.queue(x)
        await eventually(lambda: h.state.stats.done == 5)
        (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert "'bad\\ud800name'" in line and "failed alone" in line
        assert finisher.finishing() == []
    finally:
        await finisher.stop()


async def test_a_requeue_call_that_cannot_be_encoded_is_set_aside(fake: FakeRedis) -> None:
    """Beside a Go fleet a hand-back carries each stream's name: the one UTF-8 cannot encode is
    refused alone (it stays pending to us), the others go back."""
    h = Harness(fake, Config(read_retry_initial=0.001, read_retry_max=0.002, go_compatible=True))
    requeue = Requeue(h.state)
    a, bad, b = h.take("a"), unencodable(h), h.take("b")
    for x in (a, bad, b):
        h.state.holdings.drop(x)
    new_a, none, new_b = await requeue.hand_back([a, bad, b], count_retry=False, reason="r")
    assert new_a and new_b and none == ""
    assert [c.entry_id for c in fake.requeued()] == [a.entry_id, b.entry_id]
    assert bad.entry_id in fake.pending and fake.entry(h.names.stream_key, bad.entry_id)
    assert h.state.stats.handed_back == 2
    assert "wrong_type_keys_total" not in h.metrics


async def test_reasons_and_tracebacks_go_escaped(fake: FakeRedis) -> None:
    h = Harness(fake, Config(read_retry_initial=0.001, read_retry_max=0.002, max_retries=0))
    requeue = Requeue(h.state)
    x = h.take("s")
    h.state.holdings.drop(x)
    assert await requeue.hand_back(
        [x], count_retry=True, reason="no \udcff", traceback="tb \ud800"
    ) == [""]
    ((letter_id, _),) = fake.streams[h.names.dead_letter_key]
    letter = fake.entry(h.names.dead_letter_key, letter_id)
    assert letter is not None
    assert (letter["_reason"], letter["_traceback"]) == ("no \\udcff", "tb \\ud800")
    assert NOT_SENT not in letter["_reason"]


def test_sendable_escapes_lone_surrogates_only() -> None:
    assert sendable("plain") == "plain"
    assert sendable("ü \U0001f600") == "ü \U0001f600"
    assert sendable("a\ud800b\udfff") == "a\\ud800b\\udfff"
