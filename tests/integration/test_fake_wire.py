"""The unit tests' fake wire checked against the real scripts on a real server.

``tests/unit/_fakewire.py`` models ``requeue-6.lua`` and ``done-n.lua`` step by step, and the unit
tests of the re-queue, the runner, the finisher and the hand-back rely on it. Here one state is
built twice, on a real server (Redis 8.x, 7.0, Valkey) and on the fake, the same call (written by
the real builder: :func:`lbs._redis.scripts.requeue`, :func:`lbs._redis.scripts.done`) goes to
both, and their replies and what they leave behind must agree: the LBS, the dead letters, the parking stream and due index (each delay), the pending
entries, the name holders, the queued set and the pardons. New entry ids differ (the server's clock,
the fake's counter) and are compared as ``<new>``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from _lbscore import CommandBatch
from lbs._keys import (
    dead_letter_stream,
    delayed_stream,
    due_key,
    group_name,
    input_stream,
    key_prefix,
    lease_prefix,
    pardons_key,
    queued_prefix,
)
from lbs._redis import scripts

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from _fakewire import FakeRedis
from _helpers import requeue_keys, requeue_switches

pytestmark = pytest.mark.timeout(60)

_ID = re.compile(r"^\d+-\d+$")


@dataclass
class Entry:
    """One LBS entry of the scenario: its fields, who it is pending to ("": not delivered), how many
    deliveries, whether it is gone from the stream while pending (trimmed)."""

    name: str
    holder: str = "c1"
    deliveries: int = 1
    trimmed: bool = False
    fields: dict[str, str] = field(default_factory=dict)


class Both:
    """One scenario's state on the real server and on the fake, and the calls sent to both."""

    def __init__(self, r: aioredis.Redis, service: str) -> None:
        self.r, self.service, self.fake = r, service, FakeRedis()
        self.lbs = input_stream(service)
        self.ids: list[str] = []

    async def entries(self, *entries: Entry) -> list[str]:
        """XADD each (explicit ids, in order), deliver it to its holder, count extra deliveries
        (XCLAIM to the same consumer), trim where asked."""
        r, group = self.r, group_name(self.service)
        await r.xgroup_create(self.lbs, group, id="0", mkstream=True)
        for k, e in enumerate(entries, start=1):
            entry_id = f"1000-{k}"
            fields = {
                "lbs-input": f'{{"DataStreamName": "{e.name}", "Info": {{}}}}',
                **e.fields,
            }
            await r.xadd(self.lbs, fields, id=entry_id)
            self.fake.add(self.lbs, fields, entry_id)
            self.ids.append(entry_id)
        for entry_id, e in zip(self.ids, entries):
            await r.xreadgroup(group, e.holder, {self.lbs: ">"}, count=1)
            self.fake.pending[entry_id] = e.holder
            for _ in range(e.deliveries - 1):
                await r.xclaim(self.lbs, group, e.holder, 0, [entry_id], justid=False)
            if e.deliveries != 1:
                self.fake.deliveries[entry_id] = e.deliveries
            if e.trimmed:
                await r.xdel(self.lbs, entry_id)
                self.fake.streams[self.lbs] = [
                    x for x in self.fake.streams[self.lbs] if x[0] != entry_id
                ]
        return self.ids

    async def string(self, key: str, value: str) -> None:
        await self.r.set(key, value)
        self.fake.strings[key] = value

    async def members(self, key: str, *members: str) -> None:
        await self.r.sadd(key, *members)
        self.fake.sets.setdefault(key, set()).update(members)

    async def scores(self, key: str, mapping: dict[str, float]) -> None:
        await self.r.zadd(key, mapping)
        self.fake.zsets.setdefault(key, {}).update(mapping)

    async def hash(self, key: str, mapping: dict[str, str]) -> None:
        await self.r.hset(key, mapping=mapping)
        self.fake.hashes[key] = dict(mapping)

    async def requeue(self, **kw: Any) -> tuple[Any, Any]:
        """One requeue-6.lua call, on both: (the real reply, the fake's), normalized."""
        b = CommandBatch()
        s = self.service
        options = requeue_switches(
            s,
            "c1",
            kw.pop("max_retries", 3),
            kw.pop("dead_letter_on", True),
            queued_prefix=queued_prefix(s),
            key_prefix=key_prefix(s),
        )
        scripts.requeue(
            b,
            *requeue_keys(s),
            pardons_key(s),
            options=options,
            **kw,
        )
        raw = _words(b.getvalue())
        await self.r.script_load(scripts.REQUEUE.source)
        real = await self.r.execute_command(*raw)
        fake = self.fake.execute(raw, self.fake.record(raw))
        return self.normal(real), self.normal(fake)

    async def done(self, ids: list[str], names: list[str], **kw: Any) -> tuple[Any, Any]:
        """One done-n.lua call of c1's, on both: (the real reply, the fake's), as text."""
        b = CommandBatch()
        s = self.service
        scripts.done(
            b,
            self.lbs,
            lease_prefix(s) + "c1",
            ids,
            names,
            group_name(s),
            "c1",
            key_prefix=key_prefix(s),
            **kw,
        )
        raw = _words(b.getvalue())
        await self.r.script_load(scripts.DONE.source)
        real = await self.r.execute_command(*raw)
        fake = self.fake.execute(raw, self.fake.record(raw))
        return self.normal(real), self.normal(fake)

    def normal(self, x: Any) -> Any:
        """bytes as text, a new entry id as ``<new>``, a score-by-id index as (member, delay)."""
        if isinstance(x, (list, tuple)):
            return [self.normal(v) for v in x]
        if isinstance(x, bytes):
            x = x.decode()
        if isinstance(x, str) and _ID.match(x) and x not in self.ids:
            return "<new>"
        return x

    async def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What both leave behind, normalized."""
        s, r, f = self.service, self.r, self.fake
        real: dict[str, Any] = {}
        fake: dict[str, Any] = {}
        for key in (self.lbs, dead_letter_stream(s), delayed_stream(s)):
            real[key + " type"] = (await r.type(key)).decode()
            fake[key + " type"] = f.type_of(key)
            if real[key + " type"] != "stream":
                continue
            real[key] = [
                [self.normal(i), {k.decode(): self.normal(v) for k, v in fl.items()}]
                for i, fl in await r.xrange(key)
            ]
            fake[key] = [
                [self.normal(i), {k: self.normal(v) for k, v in zip(fl[::2], fl[1::2])}]
                for i, fl in f.streams.get(key, [])
            ]
        rows = await r.xpending_range(self.lbs, group_name(s), "-", "+", 100)
        real["pending"] = {
            x["message_id"].decode(): [x["consumer"].decode(), x["times_delivered"]] for x in rows
        }
        fake["pending"] = {i: [c, f.deliveries.get(i, 1)] for i, c in f.pending.items()}
        due = await r.zrange(due_key(s), 0, -1, withscores=True)
        real["due"] = sorted(int(score) - int(m.split(b"-")[0]) for m, score in due)
        fake["due"] = sorted(
            int(score) - int(m.split("-")[0]) for m, score in f.zsets.get(due_key(s), {}).items()
        )
        names = sorted([k.decode() async for k in r.scan_iter(match=f"{key_prefix(s)}name:*")])
        real["names"] = {k: self.normal(await r.get(k)) for k in names}
        fake["names"] = {
            k: self.normal(v) for k, v in f.strings.items() if k.startswith(key_prefix(s) + "name:")
        }
        real["queued"] = sorted(m.decode() for m in await r.smembers(queued_prefix(s) + "c1"))
        fake["queued"] = sorted(f.sets.get(queued_prefix(s) + "c1", set()))
        real["pardons"] = sorted(m.decode() for m in await r.zrange(pardons_key(s), 0, -1))
        fake["pardons"] = sorted(f.zsets.get(pardons_key(s), {}))
        return real, fake


def _words(raw: bytes) -> list[bytes]:
    """The arguments of the one RESP command in ``raw``."""
    parts = raw.split(b"\r\n")
    return [parts[i] for i in range(2, 2 * int(parts[0][1:]) + 1, 2)]


async def agree(both: Both, **kw: Any) -> Any:
    real, fake = await both.requeue(**kw)
    assert fake == real
    after_real, after_fake = await both.state()
    assert after_fake == after_real
    return real


async def test_recovery_of_a_dead_holders_entries(rr: aioredis.Redis, service: str) -> None:
    """Mode "absent", one call: re-queued (a death counted), merely held (none counted), trimmed,
    held by a live consumer, out of retries (dead-lettered), deaths carried and one pardoned, a name
    released, an id named twice, an id never pending."""
    both = Both(rr, service)
    ids = await both.entries(
        Entry("a"),
        Entry("b"),
        Entry("c", trimmed=True),
        Entry("d", holder="c2"),
        Entry("e", fields={"_retry_count": "3"}),
        Entry("f", deliveries=2, fields={"_retry_count": "1", "_deaths": "900-1 900-2"}),
        Entry("g"),
    )
    await both.string(lease_prefix(service) + "c2", "alive")
    await both.members(queued_prefix(service) + "c1", ids[1])
    await both.scores(pardons_key(service), {"900-2": 1})
    await both.string(key_prefix(service) + "name:g", ids[6])
    await both.string(key_prefix(service) + "name:a", "1000-99")  # another holder's: left alone
    reply = await agree(
        both,
        mode="absent",
        value="",
        count_retry=True,
        force_dead_letter=False,
        entries=[scripts.RequeueEntry(i, "lease gone") for i in [*ids, ids[0], "1-1"]],
    )
    assert [x[0] for x in reply] == [1, 1, -1, 0, 2, 1, 1, 0, 0]


async def test_hand_back_under_our_lease_parks_dead_letters_and_sets_fields(
    rr: aioredis.Redis, service: str
) -> None:
    """Mode "owned" with a retry delay: parked for its delay (the retry count's doubling, capped),
    dead-lettered past max retries with the traceback, not ours (pending to another) untouched, the
    fields a plugin sets on the copy."""
    both = Both(rr, service)
    ids = await both.entries(
        Entry("a"),
        Entry("b", fields={"_retry_count": "2"}),
        Entry("c", fields={"_retry_count": "3"}),
        Entry("d", holder="c2"),
    )
    await both.string(lease_prefix(service) + "c1", "v1")
    reply = await agree(
        both,
        mode="owned",
        value="v1",
        count_retry=True,
        force_dead_letter=False,
        traceback="Traceback: boom",
        delay=scripts.RetryDelay(1000, 3000),
        entries=[
            scripts.RequeueEntry(ids[0], "boom", 1.0, "", ("lbs-link", "span-1")),
            scripts.RequeueEntry(ids[1], "boom", 0.5),
            scripts.RequeueEntry(ids[2], "boom"),
            scripts.RequeueEntry(ids[3], "boom"),
        ],
    )
    assert [x[0] for x in reply] == [4, 4, 2, 0]
    assert [x[4] for x in reply[:2]] == [1000, 1500]  # 1 s at retry 1; min(4 s, 3 s) * 0.5


@pytest.mark.parametrize("lease", ["v2", None])
async def test_a_lease_not_ours_touches_nothing(
    rr: aioredis.Redis, service: str, lease: str | None
) -> None:
    both = Both(rr, service)
    ids = await both.entries(Entry("a"), Entry("b"))
    if lease is not None:
        await both.string(lease_prefix(service) + "c1", lease)
    reply = await agree(
        both,
        mode="owned",
        value="v1",
        count_retry=False,
        force_dead_letter=False,
        entries=[scripts.RequeueEntry(i) for i in ids],
    )
    assert reply == [[0, "lock"]] * 2


async def test_a_dead_letter_key_of_another_type_refuses_only_what_goes_there(
    rr: aioredis.Redis, service: str
) -> None:
    """Mode "any", forced to the dead letters: refused ({-2, ...}) with nothing written, while a
    trimmed entry of the same call is still cleaned; without a dead-letter stream: dropped (code 3)."""
    both = Both(rr, service)
    ids = await both.entries(Entry("a"), Entry("b", trimmed=True))
    await both.hash(dead_letter_stream(service), {"x": "1"})
    reply = await agree(
        both,
        mode="any",
        value="",
        count_retry=False,
        force_dead_letter=True,
        entries=[scripts.RequeueEntry(i, "malformed") for i in ids],
    )
    assert [x[0] for x in reply] == [-2, -1]
    reply = await agree(
        both,
        mode="any",
        value="",
        count_retry=False,
        force_dead_letter=True,
        dead_letter_on=False,
        entries=[scripts.RequeueEntry(ids[0], "malformed")],
    )
    assert [x[0] for x in reply] == [3]


@pytest.mark.parametrize("retrying", [False, True])
async def test_done_acks_ours_releases_names_and_reports_the_rest(
    rr: aioredis.Redis, any_server: Any, service: str, retrying: bool
) -> None:
    """done-n.lua under c1's lease: pending to c1 (done, its name released when it holds it),
    trimmed while pending (done), not pending (lost; "finished" when the call is a retry); and under
    a lease c1 no longer holds: every entry lost, nothing written."""
    both = Both(rr, service)
    ids = await both.entries(Entry("a"), Entry("b", trimmed=True), Entry("c"), Entry("d"))
    await both.string(lease_prefix(service) + "c1", "v1")
    await both.string(key_prefix(service) + "name:a", ids[0])
    await both.string(key_prefix(service) + "name:c", "1000-99")  # another holder's: left alone
    names = [key_prefix(service) + f"name:{x}" for x in "abc"] + [""]
    xackdel = any_server.xackdel
    real, fake = await both.done(
        [*ids[:3], "1-1"], names, lease="v1", xackdel=xackdel, retrying=retrying
    )
    assert fake == real == ("1114" if retrying else "1113")
    after_real, after_fake = await both.state()
    assert after_fake == after_real
    real, fake = await both.done([ids[3]], [""], lease="v0", xackdel=xackdel, retrying=False)
    assert fake == real == "3"
    after_real, after_fake = await both.state()
    assert after_fake == after_real
