"""The minimal ACL docs/operations.md documents (Minimal ACL) is enough, and nothing less is."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs.status import collect_status
from lbs.testing import abandon, probe

from _helpers import eventually, take

#: The documented list (docs/operations.md, Minimal ACL): every command lbs sends, scripts' inner commands included.
COMMANDS = (
    "+evalsha +script|load +script|exists +xgroup|create +xreadgroup +xadd +xack +xackdel +delex "
    "+xdel +xclaim +xpending +xrange +get +mget +set +incrby +del +pexpire +pttl +exists +type "
    "+zadd +zrange +zrem +zscore +time +info +multi +exec +client|id +client|unblock +client|setinfo "
    "+hello +ping +psubscribe +punsubscribe +xlen +xinfo|groups +zremrangebyscore +zremrangebyrank +sadd +srem "
    "+sismember +hset +hdel +hgetall +xinfo|consumers +xgroup|delconsumer +rpush +lpop +llen +xgroup|setid"
)

#: What the operator's tools (lbs status, lbs dlq and their library calls) add to it (the docs say so).
OPERATOR = " +zcard +watch +unwatch +eval +xrevrange"


def _acl(service: str, user: str, password: str, commands: str) -> list[str]:
    tag = _keys.hash_tag(service)
    # Keyed processing's wakes (publish-1.lua SPUBLISHes, run_keyed SSUBSCRIBEs): its channel.
    wakes = [f"&{tag}:wake:*"] if "+spublish" in commands else []
    return [
        "SETUSER",
        user,
        "reset",
        "on",
        f">{password}",
        "-@all",
        *commands.split(),
        f"~{_keys.input_stream(service)}",
        f"~{tag}:*",  # the leases {tag}:lease:<id> among the rest
        f"&__keyspace@0__:{_keys.lease_prefix(service)}*",  # the leases' expired events
        *wakes,
    ]


async def _cycle(url: str, service: str, lock_ttl: float) -> lbs.Client:
    """Register, take, finish; then a consumer dies holding one and another recovers it (its keyspace
    listener subscribed to the leases' expired events), finishes all and ticks (the finished batches'
    token records deleted)."""
    cfg = lbs.Config(
        lock_ttl=lock_ttl,
        read_block=0.1,
        configure_keyspace_events=False,
        deadline_poll_interval=0.05,
    )
    async with lbs.Producer(url, service) as producer:
        await producer.add_streams(["a", "b", "c"])
    dying = lbs.Client(url, service, consumer_id="dying", config=cfg, load_entrypoint_plugins=False)
    await dying.start()
    await take(dying, 1)
    assert None not in (probe(dying).reader.task, probe(dying).heartbeat.task)
    await abandon(dying)  # stops reading, heartbeating and recovering: as good as dead
    survivor = lbs.Client(
        url, service, consumer_id="survivor", config=cfg, load_entrypoint_plugins=False
    )
    await survivor.start()
    # The channel rule: its PSUBSCRIBE pattern is the leases' (denied, it would retry for ever).
    await asyncio.wait_for(probe(survivor).recovery.listening.wait(), 10)
    notes = await take(survivor, 3, timeout=20)  # two fresh, one recovered from "dying"
    assert sorted(n.stream for n in notes) == ["a", "b", "c"]
    assert await survivor.done_streams(notes) == [lbs.DoneStatus.DONE] * 3
    assert await survivor.heartbeat() == 0  # HDELs the finished batches' token records
    await survivor.close()
    return survivor


def _on(server: Any, commands: str) -> str:
    """``commands`` without those ``server`` lacks (ACL SETUSER refuses a command it does not know), as
    docs/operations.md says: +xackdel before Redis 8.2 and on Valkey 9.1, +delex before 8.4 and on
    Valkey 9.1, +client|setinfo before 7.2."""
    lacks = {"+xackdel"} if not server.xackdel else set()
    lacks |= {"+delex"} if server.version < (8, 4) else set()
    lacks |= {"+client|setinfo"} if server.version < (7, 2) else set()
    return " ".join(c for c in commands.split() if c not in lacks)


@pytest.mark.parametrize("msetnx", ["", " +msetnx"], ids=["without-msetnx", "with-msetnx"])
async def test_the_documented_acl_runs_the_whole_cycle(
    any_server: Any, service: str, rr: aioredis.Redis, msetnx: str
) -> None:
    """On every server, with what it lacks left out of the list (Redis 7.0 and Valkey 9.1 included)."""
    # +msetnx is optional: reads take their batch's names one SET at a time without it.
    r = rr
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command(
        "ACL", *_acl(service, user, password, _on(any_server, COMMANDS + msetnx))
    )
    url = any_server.url.replace("redis://", f"redis://{user}:{password}@")
    try:
        survivor = await _cycle(url, service, lock_ttl=0.5)
        assert survivor.stats.done == 3
        assert await r.xlen(lbs.input_stream(service)) == 0
        assert await r.xlen(lbs.dead_letter_stream(service)) == 0
        # A consumer back from a partition pardons what it lost (ZADD and two trims in a MULTI).
        back = lbs.Client(url, service, consumer_id="back", load_entrypoint_plugins=False)
        await probe(back).requeue.pardon(["1-1"])
        assert await r.zscore(_keys.pardons_key(service), "1-1") is not None
        await back.close()
    finally:
        await r.execute_command("ACL", "DELUSER", user)


#: What keyed processing (Publisher, run_keyed) adds to the list (docs/operations.md says so): its
#: scripts' commands (+hset +hdel too, which the list has for the consumers' token records), then the
#: wake listener's +ssubscribe (with the channel ``&{<service>-input}:wake:*``, see ``_acl``).
KEYED = " +hmget +xtrim +hexists +spublish"
WAKES = " +ssubscribe"


async def test_the_documented_acl_runs_keyed_processing(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """Publish, process in order, retry a failing message (parked, promoted) until it is
    dead-lettered, as a user with the documented list plus the keyed commands."""
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command(
        "ACL", *_acl(service, user, password, COMMANDS + " +msetnx" + KEYED + WAKES)
    )
    url = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
    seen: list[str] = []
    c = lbs.Client(
        url,
        service,
        consumer_id="k",
        load_entrypoint_plugins=False,
        config=lbs.Config(
            read_block=0.1,
            configure_keyspace_events=False,
            max_retries=1,
            retry_delay=0.05,
            retry_delay_max=0.05,
        ),
    )

    async def handle(batch: lbs.KeyedBatch) -> None:
        if batch.messages[0].fields["n"] == "poison":
            raise ValueError("poison")
        seen.extend(m.fields["n"] for m in batch.messages)

    try:
        async with lbs.Publisher(url, service) as pub:
            await pub.publish_many(
                [("t", {"n": "0"}), ("p", {"n": "poison"}), ("p", {"n": "after"})]
            )
        runner = asyncio.create_task(c.run_keyed(handle, batch=1))

        async def finished() -> bool:
            return c.stats.done == 2

        await eventually(finished, timeout=30)
        await c.close()
        await runner
        assert seen == ["0", "after"]
        (letter,) = await r.xrange(lbs.dead_letter_stream(service))
        assert letter[1][b"n"] == b"poison"
    finally:
        await c.close()
        await r.execute_command("ACL", "DELUSER", user)


def _without(commands: str, missing: str) -> str:
    """``commands`` less ``missing`` (a whole rule: taking +hget away leaves +hgetall)."""
    return " ".join(c for c in commands.split() if c != missing)


@pytest.mark.parametrize("missing", ["+type", "+time", "+incrby"])
async def test_without_a_command_of_the_list_the_reader_is_refused(
    redis_server: Any, service: str, r: aioredis.Redis, missing: str
) -> None:
    # The list is not padded: a command the scripts call inside, taken away, stops the reads
    # (+incrby: a read's take gets its batch's token from the fence, and what it read goes back). The start's
    # first heartbeat (extend-n.lua: TYPE, TIME) may refuse first: then start() raises, naming it.
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command("ACL", *_acl(service, user, password, _without(COMMANDS, missing)))
    url = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
    await r.xadd(lbs.input_stream(service), {"lbs-input": '{"DataStreamName":"x","Info":{}}'})
    c = lbs.Client(
        url,
        service,
        consumer_id="c",
        load_entrypoint_plugins=False,
        config=lbs.Config(read_block=0.1, configure_keyspace_events=False, read_max_retries=0),
    )
    try:
        try:
            await c.start()
        except lbs.RedisOperationError as exc:
            why = str(exc)
        else:
            note = await asyncio.wait_for(c.next_notification(), 10)
            assert note is not None and note.type is lbs.NotificationType.STREAM_TERMINATED
            why = note.reason
        assert "NOPERM" in why or "permission" in why.lower(), why
        assert missing.lstrip("+").upper() in why.upper(), why
    finally:
        await c.close()
        await r.execute_command("ACL", "DELUSER", user)
    await eventually(lambda: _pending_is(r, service, 0))


async def test_a_denied_token_record_cleanup_does_not_fail_the_heartbeat(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command("ACL", *_acl(service, user, password, _without(COMMANDS, "+hdel")))
    url = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
    await r.xadd(lbs.input_stream(service), {"lbs-input": '{"DataStreamName":"a","Info":{}}'})
    await r.xadd(lbs.input_stream(service), {"lbs-input": '{"DataStreamName":"b","Info":{}}'})
    c = lbs.Client(
        url,
        service,
        consumer_id="c",
        load_entrypoint_plugins=False,
        config=lbs.Config(read_block=0.1, configure_keyspace_events=False, max_streams=2),
    )
    try:
        await c.start()
        await take(c, 2)
        assert await c.done_stream("a") is lbs.DoneStatus.DONE  # its batch's record is to go
        assert await c.heartbeat() == 0  # "b" is still held, its lease extended
        assert [h.stream for h in c.held_streams()] == ["b"]
    finally:
        await c.close()
        await r.execute_command("ACL", "DELUSER", user)


async def _pending_is(r: aioredis.Redis, service: str, n: int) -> bool:
    return (
        int((await r.xpending(lbs.input_stream(service), lbs.group_name(service)))["pending"]) == n
    )


@pytest.mark.parametrize("missing", [*KEYED.split(), "+hset", "+hdel"])
async def test_without_a_keyed_command_the_scripts_refuse_before_writing(
    redis_server: Any,
    service: str,
    r: aioredis.Redis,
    missing: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The keyed list is not padded either: each command taken away is a NOPERM naming it, raised by
    the Publisher or logged by the consumer, and the script that needed it wrote nothing."""
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command(
        "ACL",
        *_acl(
            service,
            user,
            password,
            _without(COMMANDS + " +msetnx" + KEYED + WAKES, missing),
        ),
    )
    url = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
    command = missing.lstrip("+").upper()
    c = lbs.Client(
        url,
        service,
        consumer_id="k",
        load_entrypoint_plugins=False,
        config=lbs.Config(
            read_block=0.1,
            configure_keyspace_events=False,
            max_retries=1,
            retry_delay=0.05,
            retry_delay_max=0.05,
            lock_ttl=1.0,
        ),
    )

    async def handle(batch: lbs.KeyedBatch) -> None:
        raise ValueError("fails: the retry path (parking, HDEL) runs too")

    try:
        try:
            async with lbs.Publisher(url, service) as pub:
                await pub.publish_many([("t", {"n": "0"}), ("t", {"n": "1"})])
        except lbs.RedisOperationError as exc:
            assert "NOPERM lbs publish-1: the ACL does not allow " + command in str(exc)
            assert await r.exists(_keys.keyed_stream(service, "t"), lbs.input_stream(service)) == 0
            return
        before = await r.xrange(_keys.keyed_stream(service, "t"))
        runner = asyncio.create_task(c.run_keyed(handle, batch=1))

        async def refused() -> bool:
            return any(
                "the ACL does not allow " + command in rec.getMessage() for rec in caplog.records
            )

        await eventually(refused, timeout=20)
        await c.close()
        await runner
        assert (
            await r.xrange(_keys.keyed_stream(service, "t")) == before
        )  # no message trimmed or lost
        assert await r.xlen(lbs.dead_letter_stream(service)) == 0
    finally:
        await c.close()
        await r.execute_command("ACL", "DELUSER", user)


class _Gauges:
    """The gauges a client records (hook lbs_metric)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    @lbs.hookimpl
    def lbs_metric(self, name: str, value: float, labels: Any) -> None:
        self.values[name] = value


async def test_the_documented_acl_runs_metrics_status_and_the_dead_letter_tools(
    redis_server: Any, service: str, r: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """As a user with exactly the documented rules (worker, keyed and operator lists): a consumer's
    gauges are sampled, run() and run_keyed() dead-letter a failure each, and status, the
    dead-letter tools (a keyed letter's replay included) and the lbs command all work."""
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command(
        "ACL", *_acl(service, user, password, COMMANDS + " +msetnx" + KEYED + WAKES + OPERATOR)
    )
    url = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
    gauges = _Gauges()
    cfg = lbs.Config(
        read_block=0.1,
        configure_keyspace_events=False,
        max_retries=0,
        retry_delay=0,
        metrics_interval=0.05,
    )
    try:
        async with lbs.Producer(url, service) as producer:
            await producer.add_streams(["ok", "bad"])

        async def handle(note: lbs.Notification) -> None:
            if note.stream == "bad":
                raise ValueError("bad")

        async def keyed(batch: lbs.KeyedBatch) -> None:
            raise ValueError("poison")

        c = lbs.Client(
            url,
            service,
            consumer_id="c",
            config=cfg,
            plugins=[gauges],
            load_entrypoint_plugins=False,
        )
        runner = asyncio.create_task(c.run(handle))

        async def sampled() -> bool:
            return gauges.values.get("dead_letter_depth") == 1 and "backlog_depth" in gauges.values

        await eventually(sampled, timeout=20)
        await c.close()
        await runner
        async with lbs.Publisher(
            url, service
        ) as pub:  # after run(): its handler would take the key too
            await pub.publish("key", {"n": "poison"})
        k = lbs.Client(url, service, consumer_id="k", config=cfg, load_entrypoint_plugins=False)
        runner = asyncio.create_task(k.run_keyed(keyed))
        await k.wait_finished(1, timeout=20)
        await k.close()
        await runner
        assert not [rec for rec in caplog.records if "ACL denies" in rec.getMessage()]
        st = await collect_status(url, service)
        assert st.dead_letters == 2
        env = {k: v for k, v in os.environ.items() if not k.startswith("LBS_")}
        for args in (
            ["status", service, "--url", url, "--json"],
            ["dlq", "list", service, "--url", url],
        ):
            done = subprocess.run(
                [sys.executable, "-m", "lbs", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
        async with lbs.DeadLetters(url, service) as dlq:
            assert await dlq.count() == 2
            replays = await dlq.replay(all=True)
            assert sorted(x.stream for x in replays) == ["bad", "key"] and {
                x.outcome for x in replays
            } == {"replayed"}
            assert await dlq.purge(all=True) == 0
    finally:
        await r.execute_command("ACL", "DELUSER", user)


async def test_a_denied_gauge_sample_says_once_which_rule_is_missing(
    redis_server: Any, service: str, r: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await r.execute_command("ACL", *_acl(service, user, password, COMMANDS.replace(" +xlen", "")))
    url = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
    c = lbs.Client(
        url,
        service,
        consumer_id="c",
        load_entrypoint_plugins=False,
        config=lbs.Config(read_block=0.1, configure_keyspace_events=False, metrics_interval=0.02),
    )

    def denials() -> list[str]:
        return [
            rec.getMessage()
            for rec in caplog.records
            if rec.levelname == "WARNING" and "ACL denies" in rec.getMessage()
        ]

    try:
        await c.start()

        async def warned() -> bool:
            return bool(denials())

        await eventually(warned, timeout=20)
        await asyncio.sleep(0.2)  # ten more samples, all denied: still one warning
        (warning,) = denials()
        assert (
            "sampling the queue lengths" in warning and "add +xlen to the user's rules" in warning
        )
    finally:
        await c.close()
        await r.execute_command("ACL", "DELUSER", user)
