"""Batches encoded by the core, over a redis-py connection, against a real server."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from lbs._redis.subscription import Subscription
from lbs._redis.wire import Wire

from _helpers import eventually, is_true

SCRIPT = "return {KEYS[1], ARGV[1]}"


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
async def rp(redis_server: Any, request: pytest.FixtureRequest) -> Any:
    """A redis-py client on ``redis_server`` speaking RESP2, then RESP3."""
    async with aioredis.Redis.from_url(redis_server.url, protocol=request.param) as c:
        yield c


async def test_each_command_gets_its_own_reply_and_errors_stay_per_command(
    rp: aioredis.Redis, service: str
) -> None:
    wire = Wire(rp)
    try:
        replies = await wire.execute(
            lambda b: (
                b.command("SET", f"{service}:k", "v"),
                b.command("LPUSH", f"{service}:k", "x"),  # WRONGTYPE
                b.command("GET", f"{service}:k"),
            )
        )
        assert replies[0] == b"OK" or replies[0] == "OK"
        assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
        assert replies[2] == b"v"
        assert await wire.execute(lambda b: None) == []
    finally:
        await wire.close()
        await rp.delete(f"{service}:k")


async def test_noscript_loads_the_scripts_and_sends_the_batch_again(
    rp: aioredis.Redis, service: str
) -> None:
    sha = await rp.script_load(SCRIPT)
    sha = sha.decode() if isinstance(sha, bytes) else sha
    await rp.script_flush()
    wire = Wire(rp, [SCRIPT])
    try:
        (reply,) = await wire.execute(
            lambda b: b.evalsha_locks(sha, (), b"lock:", ["1-0"], (), None, True)
        )
        assert reply == [b"lock:1-0", b"1-0"]
    finally:
        await wire.close()


@pytest.mark.parametrize("parts", [1, 2], ids=["one write", "chunked"])
async def test_a_connection_closed_while_idle_is_replaced_before_the_next_batch(
    rp: aioredis.Redis, parts: int
) -> None:
    # CLIENT KILL (or a restart) while the Wire holds its connection idle: the
    # next batch must not be written to the dead socket and fail; the Wire
    # sees the EOF and sends on a fresh connection.
    wire = Wire(rp)
    try:
        (cid,) = await wire.execute(lambda b: b.command("CLIENT", "ID"))
        await rp.client_kill_filter(_id=cid)
        await eventually(lambda: is_true(wire._conn._reader.at_eof()))
        assert await wire.execute_chunks(parts, lambda b, k: b.command("PING")) in (
            [b"PONG"] * parts,
            ["PONG"] * parts,
        )
    finally:
        await wire.close()


@pytest.mark.parametrize("retry_safe", [False, True])
async def test_a_batch_whose_connection_drops_in_flight_is_resent_only_when_safe(
    rp: aioredis.Redis, service: str, retry_safe: bool
) -> None:
    # The batch kills its own connection after an INCR: the reply is lost. Sent
    # again (retry_safe), it runs on a fresh connection, whose id the KILL no
    # longer matches; otherwise the failure is raised and it ran once.
    wire = Wire(rp)
    key = f"{service}:runs"
    try:
        (cid,) = await wire.execute(lambda b: b.command("CLIENT", "ID"))

        def build(b: Any) -> None:
            b.command("INCR", key)
            b.command("CLIENT", "KILL", "ID", cid, "SKIPME", "no")  # replies, then hangs up
            b.command("PING")  # never answered the first time

        if retry_safe:
            runs, killed, pong = await wire.execute(build, retry_safe=True)
            assert runs == 2 and killed == 0  # the old connection is gone: nobody to kill
            assert pong in (b"PONG", "PONG")
        else:
            with pytest.raises(RedisConnectionError):
                await wire.execute(build)
            assert int(await rp.get(key)) == 1
    finally:
        await wire.close()


async def test_parts_of_a_chunked_batch_reply_in_order_with_errors_per_command(
    rp: aioredis.Redis, service: str
) -> None:
    wire = Wire(rp)
    built: list[int] = []

    def build(b: Any, k: int) -> None:
        built.append(k)
        if k == 1:
            b.command("LPUSH", f"{service}:s", "x")  # WRONGTYPE: a string
            return
        b.command("SET", f"{service}:s", f"v{k}")
        b.command("GET", f"{service}:s")

    try:
        replies = await wire.execute_chunks(3, build)
        assert built == [0, 1, 2]
        assert [r.decode() if isinstance(r, bytes) else r for r in (replies[0], replies[1])] == [
            "OK",
            "v0",
        ]
        assert isinstance(replies[2], ResponseError) and "WRONGTYPE" in str(replies[2])
        assert replies[4] == b"v2" and len(replies) == 5
        assert await wire.execute_chunks(0, build) == []
        # A part may be empty.
        assert await wire.execute_chunks(2, lambda b, k: b.command("PING") if k else None) in (
            [b"PONG"],
            ["PONG"],
        )
    finally:
        await wire.close()
        await rp.delete(f"{service}:s")


async def test_a_chunked_batch_after_noscript_is_encoded_and_sent_again(rp: aioredis.Redis) -> None:
    sha = await rp.script_load(SCRIPT)
    sha = sha.decode() if isinstance(sha, bytes) else sha
    await rp.script_flush()
    wire = Wire(rp, [SCRIPT])
    built: list[int] = []

    def build(b: Any, k: int) -> None:
        built.append(k)
        b.evalsha_locks(sha, (), b"lock:", [f"{k}-0"], (), None, True)

    try:
        replies = await wire.execute_chunks(3, build)
        assert replies == [[f"lock:{k}-0".encode(), f"{k}-0".encode()] for k in range(3)]
        assert built == [0, 1, 2, 0, 1, 2]
    finally:
        await wire.close()


async def test_a_part_that_fails_to_encode_drops_the_connection(rp: aioredis.Redis) -> None:
    wire = Wire(rp)

    def build(b: Any, k: int) -> None:
        if k == 1:
            raise ValueError("cannot encode")
        b.command("PING")

    try:
        with pytest.raises(ValueError):
            await wire.execute_chunks(2, build)  # part 0 is on the wire, its reply unread
        # The unread reply went with the connection: the next batch reads its own.
        assert await wire.execute(lambda b: b.command("ECHO", "mine")) in ([b"mine"], ["mine"])
    finally:
        await wire.close()


async def test_a_batch_that_gets_no_reply_drops_its_connection_after_the_reply_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that answers nothing (stopped: as a half-open connection looks) fails the batch after
    # REPLY_TIMEOUT instead of leaving it (and every batch queued behind it on the wire) waiting on TCP.
    import signal

    from lbs._redis import wire as wire_module
    from lbs.embedded import RedisServer

    monkeypatch.setattr(wire_module, "REPLY_TIMEOUT", 0.3)
    with RedisServer() as srv:
        r = aioredis.Redis.from_url(srv.url)
        wire = Wire(r)
        try:
            assert await wire.execute(lambda b: b.command("PING")) in ([b"PONG"], ["PONG"])
            assert srv.process is not None
            srv.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(RedisConnectionError, match=r"no reply within 0\.3s"):
                    await wire.execute(lambda b: b.command("PING"))
            finally:
                srv.process.send_signal(signal.SIGCONT)
            assert await wire.execute(lambda b: b.command("PING")) in (
                [b"PONG"],
                ["PONG"],
            )  # a fresh connection
        finally:
            await wire.close()
            await r.aclose()


# -- Subscription: Pub/Sub messages read in bulk --------------------------------------------------


async def _subscribed(r: aioredis.Redis) -> int:
    """How many connections of the server are subscribed to patterns."""
    return sum(1 for c in await r.client_list() if int(c.get("psub", 0)))


async def test_a_subscription_reads_a_burst_in_bulk_and_answers_pings(
    rp: aioredis.Redis, service: str
) -> None:
    before = await _subscribed(rp)
    sub = Subscription(rp)
    await sub.open(f"{service}:*")
    try:
        pipe = rp.pipeline(transaction=False)
        for i in range(5000):
            pipe.publish(f"{service}:{i}", "expired")
        await pipe.execute()
        got: list[Any] = []
        while len(got) < 5000:
            batch = await sub.messages(5.0)
            assert batch, f"only {len(got)} of 5000 messages came"
            got += batch
        assert got[0] == [b"pmessage", f"{service}:*".encode(), f"{service}:0".encode(), b"expired"]
        assert [m[2] for m in got] == [
            f"{service}:{i}".encode() for i in range(5000)
        ]  # in order, none lost
        sub.ping()
        pong = await sub.messages(5.0)
        assert pong in ([[b"pong", b""]], [b"PONG"], ["PONG"]), pong
        assert await sub.messages(0.05) == []  # nothing more: an empty list once the wait is over
    finally:
        await sub.close()

    async def unsubscribed() -> bool:
        return await _subscribed(rp) == before

    await eventually(unsubscribed)  # closed: the connection went back unsubscribed (disconnected)


async def test_a_subscription_whose_connection_is_killed_raises(
    rp: aioredis.Redis, service: str
) -> None:
    sub = Subscription(rp)
    await sub.open(f"{service}:*")
    try:
        await rp.client_kill_filter(_type="pubsub")
        # Whichever read first meets the killed connection raises.
        with pytest.raises(RedisConnectionError):  # noqa: PT012
            for _ in range(50):
                await sub.messages(0.1)
    finally:
        await sub.close()


async def test_heard_pings_a_quiet_link_and_finds_a_stopped_server_half_open() -> None:
    """``Subscription.heard``: on a live quiet link its PINGs come back (no error for many times the
    interval); with the server stopped nothing comes back and it raises within about twice it."""
    import signal
    import time

    from lbs.embedded import RedisServer

    with RedisServer() as srv:
        r = aioredis.Redis.from_url(srv.url)
        sub = Subscription(r)
        try:
            await sub.open("{s}:wake:c1", command="SSUBSCRIBE")
            until = time.monotonic() + 1.0
            while time.monotonic() < until:  # 10 intervals of quiet: each PING answered
                await sub.heard(0.1)
            assert srv.process is not None
            srv.process.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(ConnectionError, match="half-open"):  # noqa: PT012
                    while time.monotonic() - started < 10:
                        await sub.heard(0.1)
            finally:
                srv.process.send_signal(signal.SIGCONT)
        finally:
            await sub.close()
            await r.aclose()
