"""Requeue against a fake wire: what each requeue-6.lua outcome means for a hand-back, a
recovery and a dead letter (stats, hooks, metrics, notifications), the park that falls back to
a re-queue, the dead letters kept and tried again, the pardons of lost_while_alive."""

from __future__ import annotations

import pytest

from _lbscore import EntryParser
from lbs._consumer.requeue import Requeue
from lbs.config import Config
from lbs.exceptions import RedisOperationError
from lbs.notifications import NotificationType

from _fakewire import FakeRedis, Harness


def _requeue(fake: FakeRedis, **config: object) -> tuple[Harness, Requeue]:
    h = Harness(fake, Config(read_retry_initial=0.001, read_retry_max=0.002, **config))  # type: ignore[arg-type]
    return h, Requeue(h.state)


async def test_hand_back_re_queues_under_our_lease_and_reports_it(fake: FakeRedis) -> None:
    h, requeue = _requeue(fake)
    x = h.take("s", {"payload": "p"}, retry_count=1)
    h.state.holdings.drop(x)
    (new_id,) = await requeue.hand_back([x], count_retry=True, reason="boom")
    (call,) = fake.requeued()
    n = h.names
    assert call.keys[:3] == [n.stream_key, n.dead_letter_key, n.lease_prefix]
    assert [call.entry_id, call.mode, call.value, call.increment] == [
        x.entry_id,
        "owned",
        h.state.lease.value,
        "1",
    ]
    assert call.reason == "boom" and call.options[4] == n.id and call.first_ms == "0"  # at once
    copy = fake.entry(n.stream_key, new_id)
    assert copy is not None and copy["payload"] == "p" and copy[n.original_field] == x.entry_id
    assert copy[n.retry_field] == "1"
    assert fake.entry(n.stream_key, x.entry_id) is None and x.entry_id not in fake.pending
    assert h.lease == h.state.lease.value  # the lease holds what else is pending to us
    assert h.state.stats.handed_back == 1 and requeue.handing_back == set()
    assert h.recorder.of("lbs_stream_handed_back") == [
        dict(stream="s", entry_id=x.entry_id, new_entry_id=new_id, retry_counted=True)
    ]


@pytest.mark.parametrize("dlq", [None, ""])
async def test_hand_back_past_max_retries_dead_letters(fake: FakeRedis, dlq: str | None) -> None:
    h, requeue = _requeue(fake, max_retries=1, dead_letter_stream=dlq)
    x = h.take("s", {h.names.retry_field: "1"})
    assert await requeue.hand_back([x], count_retry=True, reason="boom", traceback="tb") == [""]
    (event,) = h.recorder.of("lbs_stream_dead_lettered")
    assert event["entry_id"] == x.entry_id and event["reason"] == "boom"
    if dlq is None:
        ((letter_id, _),) = fake.streams[h.names.dead_letter_key]
        letter = fake.entry(h.names.dead_letter_key, letter_id)
        assert letter is not None and letter["_traceback"] == "tb"
        assert event["dead_letter_id"] == letter_id
    else:
        assert event["dead_letter_id"] == ""  # dropped: no dead-letter stream
    assert h.state.stats.dead_lettered == 1 and h.state.stats.handed_back == 0
    assert h.recorder.of("lbs_stream_handed_back") == []


async def test_a_park_refused_for_a_wrong_type_key_re_queues_at_once(fake: FakeRedis) -> None:
    h, requeue = _requeue(fake, retry_delay=1.0, retry_delay_max=4.0)
    x, y = h.take("x"), h.take("y")
    ids = await requeue.hand_back([x], count_retry=True, reason="r", delay=None)
    first = fake.requeued()[-1]
    assert [first.first_ms, first.max_ms] == ["1000", "4000"] and 0.5 <= float(first.jitter) <= 1.0
    assert ids[0] in fake.zsets[requeue.delays.due_key]  # parked, due after its delay
    assert h.state.stats.retries_delayed == 1
    fake.streams.pop(requeue.delays.parked_key)
    fake.hashes[requeue.delays.parked_key] = {"x": "1"}  # the parking stream is a hash now
    (again,) = await requeue.hand_back([y], count_retry=True, reason="r", delay=None)
    *_, refused, at_once = fake.requeued()
    assert refused.first_ms == "1000" and at_once.first_ms == "0"
    assert fake.entry(h.names.stream_key, again) is not None  # in the LBS, not parked
    assert h.metrics["wrong_type_keys_total"] == 1
    assert h.state.stats.handed_back == 2 and h.state.stats.retries_delayed == 1


async def test_a_fixed_delay_parks_each_stream_that_long(fake: FakeRedis) -> None:
    h, requeue = _requeue(fake, retry_delay=1.0, retry_delay_max=4.0)
    x, y = h.take("x"), h.take("y")
    ids = await requeue.hand_back([x, y], count_retry=True, reason="r", delay=2.5)
    assert [(c.first_ms, c.max_ms, c.jitter) for c in fake.requeued()] == [
        ("2500", "2500", "1.0")
    ] * 2
    due = fake.zsets[requeue.delays.due_key]
    assert [due[i] - int(i.split("-")[0]) for i in ids] == [2500, 2500]


@pytest.mark.parametrize("lost", ["lease gone", "lease taken again", "taken elsewhere"])
async def test_hand_back_of_a_lost_stream_returns_nothing_and_counts_nothing(
    fake: FakeRedis, lost: str
) -> None:
    h, requeue = _requeue(fake)
    x = h.take("s")
    if lost == "lease gone":
        del fake.strings[h.names.lease_key]
    elif lost == "lease taken again":  # by this process, after it lapsed: a new value
        fake.strings[h.names.lease_key] = h.state.lease.value + ".2"
    else:  # pending to another consumer (lbs's recovery re-queues instead; XCLAIM by hand does this)
        fake.pending[x.entry_id] = "redis-consumer-other"
    assert await requeue.hand_back([x], count_retry=False, reason="close") == [""]
    assert h.state.stats.handed_back == 0 and h.recorder.events == {}
    assert x.entry_id in fake.pending and fake.entry(h.names.stream_key, x.entry_id)  # untouched


async def test_a_hand_back_the_connection_drops_raises_and_forgets_the_ids(
    fake: FakeRedis,
) -> None:
    h, requeue = _requeue(fake)
    x = h.take("s")
    fake.fail("requeue-6", "drop")
    with pytest.raises(RedisOperationError, match="hand back"):
        await requeue.hand_back([x], count_retry=True, reason="r")
    assert requeue.handing_back == set()
    assert len(fake.calls("requeue-6")) == 1  # not sent again: the caller decides


async def test_recover_reports_each_outcome_by_path(fake: FakeRedis) -> None:
    h, requeue = _requeue(fake, max_retries=1)
    n = h.names
    # Pending to a consumer whose lease is gone: re-queued, a retry counted.
    back = h.deliver("back", consumer="redis-consumer-dead")
    dead = h.deliver("dead", {n.retry_field: "5"}, consumer="redis-consumer-dead")  # out of retries
    trimmed = h.deliver("trimmed", consumer="redis-consumer-dead")
    fake.streams[n.stream_key] = [e for e in fake.streams[n.stream_key] if e[0] != trimmed]
    held = h.deliver("held", consumer="redis-consumer-alive")
    fake.strings[h.lease_of("redis-consumer-alive")] = "nonce"  # its holder lives
    ours = h.deliver("ours")  # pending to us, under our lease: held
    ids = [back, dead, trimmed, held, ours]
    assert await requeue.recover(ids, "keyspace", "expired") == 1
    assert [(c.entry_id, c.mode, c.value, c.increment) for c in fake.requeued()] == [
        (i, "absent", "", "1") for i in ids
    ]
    assert len(fake.calls("requeue-6")) == 1  # one call for them all
    assert all(c.keys[2] == n.lease_prefix for c in fake.calls("requeue-6"))
    assert h.metrics["recovery_keyspace_requeued_total"] == 1
    assert h.metrics["recovery_dlq_total"] == 1 and h.metrics["recovery_trimmed_total"] == 1
    assert h.hooks.series["recovery_dlq_total"] == {("keyspace",): 1}
    (expired,) = h.recorder.of("lbs_stream_expired")
    assert (expired["stream"], expired["entry_id"]) == ("back", back)
    assert (expired["retry_count"], expired["path"]) == (1, "keyspace")
    note = h.state.mailbox.get_nowait()
    assert note.type is NotificationType.STREAM_EXPIRED and note.stream == "back"
    assert note.entry_id == back and expired["new_entry_id"] in note.reason
    assert [e["entry_id"] for e in h.recorder.of("lbs_stream_dead_lettered")] == [dead]
    for alive in (held, ours):  # untouched
        assert alive in fake.pending and fake.entry(n.stream_key, alive) is not None
    assert trimmed not in fake.pending  # its pending reference cleaned


async def test_a_dead_letter_that_cannot_be_written_is_kept_and_tried_again(
    fake: FakeRedis,
) -> None:
    h, requeue = _requeue(fake)
    x = h.take("bad")
    (entry,) = EntryParser().parse_entries([[x.entry_id, [b"lbs-input", b"not json"]]])
    fake.hashes[h.names.dead_letter_key] = {"oops": "1"}  # the dead-letter key is a hash
    await requeue.malformed.dead_letter([(entry, x.value, "malformed")])
    assert requeue.malformed.undead == [(entry, x.value, "malformed")]
    assert fake.requeued()[0].mode == "owned" and h.state.stats.dead_lettered == 0
    del fake.hashes[h.names.dead_letter_key]
    await requeue.malformed.retry_undead()
    assert requeue.malformed.undead == []
    assert fake.requeued()[1].mode == "any"  # the entry is ours; the lease need not be
    assert fake.requeued()[1].force == "1"  # dead-lettered whatever its retries
    (event,) = h.recorder.of("lbs_stream_dead_lettered")
    assert event["reason"] == "malformed" and event["dead_letter_id"]
    assert h.state.stats.dead_lettered == 1


@pytest.mark.parametrize("mode", ["owned", "absent"])
async def test_lost_while_alive_re_queues_what_it_can_and_pardons_the_rest(
    fake: FakeRedis, mode: str
) -> None:
    """ "owned": under the lease taken again (a late reply's entries); "absent": while it is gone,
    before it is taken again (the heartbeat's retake). No retry counted either way."""
    h, requeue = _requeue(fake)
    gone = h.deliver("gone")  # read under the lease that lapsed, nobody took it
    taken = h.deliver("taken")
    fake.pending[taken] = "redis-consumer-other"  # moved to another consumer under its id (XCLAIM)
    fake.strings[h.lease_of("redis-consumer-other")] = "nonce"
    if mode == "absent":
        del fake.strings[h.names.lease_key]
    assert await requeue.lost_while_alive([gone, taken], "lease lost", mode=mode) == 1
    value = h.state.lease.value if mode == "owned" else ""
    assert [[c.mode, c.value, c.increment] for c in fake.requeued()] == [[mode, value, "0"]] * 2
    assert fake.entry(h.names.stream_key, gone) is None and taken in fake.pending
    assert list(fake.zsets[requeue.pardons_key]) == [taken]
    assert [c.name for c in fake.sent[-3:]] == ["ZADD", "ZREMRANGEBYSCORE", "ZREMRANGEBYRANK"]
    assert h.metrics["pardoned_total"] == 1
    assert h.metrics["recovery_heartbeat_requeued_total"] == 1
    fake.streams[requeue.pardons_key] = []  # a pardons key of another type: reported, not raised
    fake.zsets.pop(requeue.pardons_key)
    other = h.deliver("other", consumer="redis-consumer-other")
    assert await requeue.lost_while_alive([other], "lease lost", mode=mode) == 0
    assert h.metrics["wrong_type_keys_total"] == 1 and h.metrics["pardoned_total"] == 1
