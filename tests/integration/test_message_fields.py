"""Fields beside ``lbs-input``: the hooks ``lbs_message_fields`` (producer side),
``lbs_wrap_handler`` and ``lbs_hand_back_fields`` (consumer side), and ``Held.fields``.

Without a plugin nothing is added: an entry holds ``lbs-input`` alone, and a held stream's
``fields`` is empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import redis.asyncio as aioredis

import lbs

from _helpers import client, take


class Tagging:
    """Adds a field to every send, and one the client may not write (left out)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @lbs.hookimpl
    def lbs_message_fields(self, service: str) -> Mapping[str, str]:
        self.calls.append(service)
        return {"traceparent": f"tp-{len(self.calls)}", "lbs-input": "no", "_retry_count": "9"}


async def _entries(r: aioredis.Redis, service: str) -> list[dict[bytes, bytes]]:
    return [f for _, f in await r.xrange(lbs.input_stream(service))]


async def test_without_a_plugin_an_entry_holds_lbs_input_alone(
    r: aioredis.Redis, service: str
) -> None:
    for load in (False, True):  # True: the installed plugins (lbs-otel: no span, no fields)
        async with lbs.Producer(r, service, load_entrypoint_plugins=load) as producer:
            await producer.add_stream(f"a{load}")
            await producer.add_streams([f"b{load}", (f"c{load}", {"x": 1})])
    assert [sorted(f) for f in await _entries(r, service)] == [[b"lbs-input"]] * 6
    async with client(r, service) as c:
        await c.start()
        notes = await take(c, 6)
        assert [c.find_held(n.stream, n.entry_id).fields for n in notes] == [{}] * 6  # type: ignore[union-attr]


async def test_a_plugin_adds_fields_once_per_call_to_every_entry(
    r: aioredis.Redis, service: str
) -> None:
    tagging = Tagging()
    async with lbs.Producer(r, service, plugins=[tagging], load_entrypoint_plugins=False) as p:
        await p.add_stream("a")
        await p.add_streams(["b", "c"])
    assert tagging.calls == [service, service]  # per call, not per entry
    entries = await _entries(r, service)
    assert [e.get(b"traceparent") for e in entries] == [b"tp-1", b"tp-2", b"tp-2"]
    assert all(sorted(e) == [b"lbs-input", b"traceparent"] for e in entries)  # lbs's own left out
    async with client(r, service) as c:
        await c.start()
        notes = await take(c, 3)
        held = [c.find_held(n.stream, n.entry_id) for n in notes]
        assert [h.fields.get(b"traceparent") for h in held if h] == [b"tp-1", b"tp-2", b"tp-2"]


async def test_a_publisher_adds_them_to_every_message(r: aioredis.Redis, service: str) -> None:
    tagging = Tagging()
    async with lbs.Publisher(r, service, plugins=[tagging], load_entrypoint_plugins=False) as pub:
        await pub.publish_many([("k", {"n": "1"}), ("k", {"n": "2"})])
    messages = await r.xrange(f"{{{service}-input}}:k:k")
    assert [f for _, f in messages] == [
        {b"n": b"1", b"traceparent": b"tp-1"},
        {b"n": b"2", b"traceparent": b"tp-1"},
    ]


class Linking:
    """Wraps the handler, and sets a field on each handed-back copy: what a tracing plugin does."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, dict[bytes, bytes]]] = []

    @lbs.hookimpl
    def lbs_wrap_handler(
        self, client: lbs.Client, handler: Callable[[lbs.Notification], Awaitable[Any]]
    ) -> Callable[[lbs.Notification], Awaitable[Any]]:
        async def wrapped(note: lbs.Notification) -> Any:
            held = client.find_held(note.stream, note.entry_id)
            assert held is not None
            self.seen.append((note.retry_count, dict(held.fields)))
            return await handler(note)

        return wrapped

    @lbs.hookimpl
    def lbs_hand_back_fields(self, held: lbs.Held, retry_counted: bool) -> Mapping[str, str]:
        return {"lbs-link": f"attempt-{held.retry_count}", "_reason": "not ours to set"}


async def test_a_handed_back_copy_carries_the_plugins_fields_replacing_the_last_ones(
    r: aioredis.Redis, service: str
) -> None:
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        await p.add_stream("s")
    linking = Linking()
    done = asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        if note.retry_count < 2:
            raise RuntimeError("not yet")
        done.set()

    c = client(r, service, plugins=[linking], retry_delay=0.0)
    runner = asyncio.create_task(c.run(handler))
    try:
        await asyncio.wait_for(done.wait(), 20)
    finally:
        await c.close()
        await runner
    assert linking.seen[0] == (0, {})  # lbs-input alone: nothing kept
    assert [(n, f.get(b"lbs-link")) for n, f in linking.seen[1:]] == [
        (1, b"attempt-0"),
        (2, b"attempt-1"),  # replaced, not added twice
    ]
    assert all(b"_reason" not in f for _, f in linking.seen)  # lbs's own names left out
