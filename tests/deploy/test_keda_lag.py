"""What KEDA's ``redis-streams`` scaler reads of an lbs service, beside what ``lbs status --json``
reports, on real servers (Redis 8.x and 7.0), through a retry, a killed consumer's recovery and
a deletion that hides the lag.

The scaler (kedacore/keda ``pkg/scalers/redis_streams_scaler.go``) is mimicked command for
command: ``lagCount`` reads the group's ``lag`` from XINFO GROUPS (XLEN while the group does not
exist, 0 without the stream; a NULL lag comes out of its client, go-redis, as -1);
``pendingEntriesCount`` the XPENDING count; ``streamLength`` XLEN. A trigger is active when its
number exceeds ``activationLagCount`` (0 in deploy/k8s/keda.yaml).

The relations asserted, in every state (docs/deployment.md#keda):

* a lag Redis can compute equals ``backlog`` (entries not yet delivered);
* XPENDING's count equals ``pending`` (held, or left by a dead consumer until recovered);
* XLEN of the LBS equals ``backlog + pending`` (lbs deletes what it finishes): the ``unfinished``
  trigger, exact even when the lag is NULL;
* a retry parked for its back-off is in none of them, only in ``{<service>-input}:delayed``
  (``delayed.parked``): the ``parked-retries`` trigger.

And KEDA's connection as the Secret's ``username`` (keda.yaml's TriggerAuthentication): the
read-only ACL user docs/deployment.md gives KEDA reads what the triggers read, and writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs.testing import abandon, freeze

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: The figures of every state, printed at the end of each run (`pytest -s` shows them).
FIGURES: list[str] = []


@dataclass(frozen=True)
class KedaView:
    """What each trigger of keda.yaml reads, and whether it is active."""

    lag: int  # lagCount: XINFO GROUPS lag, -1 for NULL (go-redis)
    lag_null: bool
    pending: int  # pendingEntriesCount: XPENDING count
    length: int  # streamLength on <service>-input
    parked: int  # streamLength on {<service>-input}:delayed

    def active(self) -> dict[str, bool]:
        return {"backlog": self.lag > 0, "unfinished": self.length > 0, "parked": self.parked > 0}


async def keda_view(r: aioredis.Redis, service: str) -> KedaView:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    if not await r.exists(stream):
        lag, null = 0, False  # "ERR no such key": KEDA answers 0
    else:
        groups = await r.xinfo_groups(stream)
        mine = [g for g in groups if g["name"].decode() == group]
        if not mine:
            lag, null = await r.xlen(stream), False  # no group yet: KEDA falls back to XLEN
        else:
            raw = mine[0]["lag"]
            lag, null = (-1, True) if raw is None else (int(raw), False)
    pending = 0
    if await r.exists(stream) and any(
        g["name"].decode() == group for g in await r.xinfo_groups(stream)
    ):
        pending = int((await r.xpending(stream, group))["pending"])
    return KedaView(
        lag=lag,
        lag_null=null,
        pending=pending,
        length=await r.xlen(stream),
        parked=await r.xlen(_keys.delayed_stream(service)),
    )


def lbs_status(url: str, service: str) -> dict[str, Any]:
    """``lbs status SERVICE --json``, run as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LBS_")}
    done = subprocess.run(
        [sys.executable, "-m", "lbs", "status", service, "--url", url, "--json"],
        env={**env, "LBS_LOAD_PLUGINS": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


async def compare(r: aioredis.Redis, url: str, service: str, label: str) -> KedaView:
    """Both views of one quiet moment, and the relations between them."""
    view = await keda_view(r, service)
    st = await asyncio.to_thread(lbs_status, url, service)
    assert view == await keda_view(r, service), "the state moved while it was read"
    parked = (st.get("delayed") or {}).get("parked", 0)
    FIGURES.append(
        f"{label:<44} KEDA lag={view.lag}{' (NULL)' if view.lag_null else ''} "
        f"XPENDING={view.pending} XLEN={view.length} parked XLEN={view.parked} | lbs status: "
        f"backlog={st['backlog']} ({st['backlog_method']}) pending={st['pending']} "
        f"length={st['length']} parked={parked}"
    )
    if not view.lag_null:
        assert view.lag == st["backlog"], (label, view, st["backlog"])
    assert view.pending == st["pending"], (label, view)
    assert view.length == st["length"] == st["backlog"] + st["pending"], (label, view, st)
    assert view.parked == parked, (label, view)
    return view


async def until(
    r: aioredis.Redis, service: str, done: Callable[[KedaView], bool], what: str
) -> None:
    """Poll KEDA's view until ``done``; fail naming ``what`` after a minute."""
    deadline = time.monotonic() + 60.0
    while not done(await keda_view(r, service)):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within 60 s: {what}")
        await asyncio.sleep(0.05)


Handler = Callable[[lbs.Notification], Awaitable[None]]


def start(
    url: str, service: str, name: str, handler: Handler, **config: Any
) -> tuple[lbs.Client, asyncio.Task[None]]:
    """A consumer ``name`` running ``handler``: lock TTL 3 s (quick recovery, and no lock lost to a
    loaded machine's pauses), lbs-claim left out."""
    cfg = lbs.Config(lock_ttl=3.0, drain_timeout=0.5, disabled_plugins=("claim",), **config)
    client = lbs.Client(url, service, consumer_id=name, config=cfg)
    return client, asyncio.create_task(client.run(handler, concurrency=cfg.max_streams))


async def test_keda_lag_matches_lbs_status_through_retries_and_recovery(
    any_server: Any, service: str
) -> None:
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    try:
        async with lbs.Producer(url, service) as producer:
            await producer.add_streams([f"s{i}" for i in range(10)])
        view = await compare(r, url, service, "10 registered, no consumer yet")
        assert view.active() == {"backlog": True, "unfinished": True, "parked": False}

        # A consumer holding 4; s0 and s1 fail once and are parked for their back-off (an hour: they
        # stay parked however slow the machine, until the test makes them due).
        gate, failed = asyncio.Event(), set()

        async def holds(note: lbs.Notification) -> None:
            if note.stream in ("s0", "s1") and note.stream not in failed:
                failed.add(note.stream)
                raise RuntimeError("fails once")
            await gate.wait()

        a, task_a = start(
            url, service, "a", holds, max_streams=4, retry_delay=3600.0, retry_delay_max=3600.0
        )
        await until(r, service, lambda v: v.parked == 2 and v.pending == 4, "2 parked, 4 held")
        view = await compare(r, url, service, "4 held, 2 parked retries (failed once)")
        assert (view.lag, view.pending, view.parked) == (4, 4, 2)

        # Killed: its four stay pending (and out of the lag) until another consumer recovers them.
        await abandon(a)
        gate.set()
        await asyncio.wait_for(task_a, 10)
        view = await compare(r, url, service, "its consumer killed (kill -9)")
        assert (view.lag, view.pending, view.parked) == (4, 4, 2)

        async def quick(note: lbs.Notification) -> None:
            return None

        b, task_b = start(
            url, service, "b", quick, max_streams=4, retry_delay=3600.0, retry_delay_max=3600.0
        )
        await until(r, service, lambda v: v.length == v.pending == 0, "recovered and finished")
        view = await compare(r, url, service, "recovered, finished; 2 still parked")
        assert view.active() == {"backlog": False, "unfinished": False, "parked": True}

        # Due now: b brings them back into the LBS and finishes them.
        due = _keys.due_key(service)
        await r.zadd(due, dict.fromkeys(await r.zrange(due, 0, -1), 0), xx=True)
        await until(r, service, lambda v: v.length == v.pending == v.parked == 0, "retries done")
        view = await compare(r, url, service, "parked retries promoted and done")
        assert view.active() == {"backlog": False, "unfinished": False, "parked": False}
        await b.close()
        await task_b

        # The lag hidden: the last delivered entry finished (deleted) while an older one is held.
        gate2 = asyncio.Event()

        async def first_waits(note: lbs.Notification) -> None:
            if note.stream == "x0":
                await gate2.wait()

        c, task_c = start(url, service, "c", first_waits, max_streams=2)
        async with lbs.Producer(url, service) as producer:
            await producer.add_streams(["x0", "x1"])
        await until(r, service, lambda v: v.length == v.pending == 1, "x1 finished, x0 held")
        await freeze(c)  # reads no more: y0 stays undelivered
        async with lbs.Producer(url, service) as producer:
            await producer.add_streams(["y0"])
        view = await compare(r, url, service, "newest delivered deleted, older held")
        FIGURES.append(
            f"  -> lag {'NULL' if view.lag_null else view.lag}: KEDA's triggers active {view.active()}"
        )
        # Whatever the server computes, the unfinished trigger sees the work.
        assert view.active()["unfinished"] and view.length == 2
        if view.lag_null:
            assert view.active()["backlog"] is False  # -1: the lag trigger alone would sleep
        gate2.set()
        await c.close()
        await task_c
    finally:
        await r.aclose()
        print(
            f"\nKEDA's view beside lbs status on {getattr(any_server, 'name', '') or any_server.version}:"
        )
        print("\n".join(FIGURES))
        FIGURES.clear()


#: The read-only user docs/deployment.md gives KEDA, for the service "orders".
DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def documented_keda_acl(service: str, password: str) -> list[str]:
    """The documented ``ACL SETUSER orders-keda ...`` rules, for ``service`` and ``password``."""
    found = re.search(r"^ACL SETUSER orders-keda (.+)$", DOCS.read_text(), re.M)
    assert found, "docs/deployment.md gives no ACL for KEDA's user"
    keys = {
        f"~{lbs.input_stream('orders')}": f"~{lbs.input_stream(service)}",
        f"~{_keys.delayed_stream('orders')}": f"~{_keys.delayed_stream(service)}",
    }
    rules = found.group(1).split()
    assert {r for r in rules if r.startswith("~")} == set(keys), "the LBS and the parked retries"
    return [keys.get(r, f">{password}" if r.startswith(">") else r) for r in rules]


async def keda_reads(r: aioredis.Redis, service: str) -> dict[str, int]:
    """What keda.yaml's three triggers read, command for command as the scaler sends them (go-redis
    opens with HELLO, or AUTH where HELLO is refused; the scaler PINGs once; ``lagCount`` asks INFO
    for the version, then XINFO GROUPS: 0 for "no such key", XLEN while the group is missing)."""
    assert await r.ping()
    major = int(str((await r.info())["redis_version"]).split(".")[0])
    assert major >= 7, "lagCount needs Redis 7"
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    try:
        groups = await r.xinfo_groups(stream)
    except redis.exceptions.ResponseError as exc:
        assert "no such key" in str(exc), exc
        lag = 0
    else:
        mine = [g for g in groups if g["name"].decode() == group]
        raw = mine[0]["lag"] if mine else await r.xlen(stream)
        lag = -1 if raw is None else int(raw)
    return {
        "backlog": lag,
        "unfinished": await r.xlen(stream),
        "parked-retries": await r.xlen(_keys.delayed_stream(service)),
    }


async def test_keda_reads_as_the_documented_read_only_user(any_server: Any, service: str) -> None:
    """The ACL user of the Secret's `username` (keda.yaml): KEDA's reads need only the rules
    docs/deployment.md gives its user, on every server; that user writes nothing."""
    admin = aioredis.Redis.from_url(any_server.url)
    user, password = f"keda-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await admin.execute_command(
        "ACL", "SETUSER", user, "reset", *documented_keda_acl(service, password)
    )
    keda = aioredis.Redis.from_url(any_server.url, username=user, password=password, protocol=3)
    try:

        async def same(label: str) -> None:
            view, reads = await keda_view(admin, service), await keda_reads(keda, service)
            assert reads == {
                "backlog": view.lag,
                "unfinished": view.length,
                "parked-retries": view.parked,
            }, label

        await same("nothing registered (no such key)")
        async with lbs.Producer(any_server.url, service) as producer:
            await producer.add_streams(["a", "b", "c"])
        await same("3 registered, no group yet")
        # The group as a consumer's start creates it (from id 0), nothing read yet.
        await admin.xgroup_create(lbs.input_stream(service), lbs.group_name(service), id="0")
        assert (await keda_reads(keda, service))["backlog"] == 3
        await same("the group's lag")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await keda.xadd(lbs.input_stream(service), {"x": "1"})
    finally:
        await keda.aclose()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
