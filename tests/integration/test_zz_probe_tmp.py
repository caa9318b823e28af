from test_go_fleet import *  # noqa
from test_go_fleet import _client

async def test_probe_claimed(
    server: RedisServer, service: str
) -> None:
    """Between two ticks a Go consumer XCLAIMs a live lbs stream; the lbs handler then returns: done-n
    finds the entry pending under the Go consumer, lets it go and acks nothing (TAKEN)."""
    release = asyncio.Event()

    async def handle(note: lbs.Notification) -> None:
        await release.wait()

    r = aioredis.Redis.from_url(server.url)
    c = _client(server.url, service, "lbs-1", go_compatible=True, heartbeat_interval=3.5)
    runner = asyncio.create_task(c.run(handle))
    try:
        async with lbs.Producer(server.url, service) as producer:
            await producer.add_stream("t")

        async def held() -> bool:
            return len(c.held_streams()) == 1

        await eventually(held)
        (h,) = c.held_streams()
        beats = c.stats.heartbeats

        async def ticked() -> (
            bool
        ):  # right after a tick: 3.5 s before the next one refreshes the entry
            return c.stats.heartbeats > beats

        await eventually(ticked, timeout=10)
        await r.xclaim(
            lbs.input_stream(service),
            lbs.group_name(service),
            "redis-consumer-go-1",
            0,
            [h.entry_id],
        )
        release.set()

        async def not_done() -> bool:
            return c.metrics.get("go_taken_total", 0) == 1 and c.stats.lock_lost == 1

        await asyncio.sleep(2)
        pend = await r.xpending_range(lbs.input_stream(service), lbs.group_name(service), '-', '+', 10)
        print('PROBE done=%d lock_lost=%d go_taken=%s pending=%s xlen=%d' % (c.stats.done, c.stats.lock_lost, c.metrics.get('go_taken_total', 0), pend, await r.xlen(lbs.input_stream(service))))
        return
        assert c.stats.done == 0
        pending = await r.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
        )
        assert [(p["message_id"].decode(), p["consumer"]) for p in pending] == [
            (h.entry_id, b"redis-consumer-go-1")
        ]
        assert c.held_streams() == []  # lbs let it go
    finally:
        release.set()
        await c.close()
        await runner
        await r.aclose()


