"""lbs-otel in one process: a producer's span is the parent of the handler's, every outcome gets its
span, a failed attempt is linked from the next; with the API alone nothing is wrapped or added."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.trace import SpanKind, StatusCode

import lbs
from lbs_otel import LINK_FIELD, OtelPlugin, context_of

from _otel_helpers import memory_provider, named

pytestmark = pytest.mark.integration


def _client(r: aioredis.Redis, service: str, plugin: object, **config: Any) -> lbs.Client:
    config.setdefault("read_block", 0.1)
    config.setdefault("drain_timeout", 0.0)
    return lbs.Client(
        r, service, "otel", lbs.Config(**config), plugins=[plugin], load_entrypoint_plugins=False
    )


async def _run_until(c: lbs.Client, handler: Any, finished: int, keyed: bool = False) -> None:
    runner = asyncio.create_task(c.run_keyed(handler) if keyed else c.run(handler))
    try:
        await c.wait_finished(finished, timeout=30)
    finally:
        await c.close()
        await runner


async def test_the_handler_span_is_the_child_of_the_producers(
    r: aioredis.Redis, service: str
) -> None:
    provider, exporter = memory_provider()
    plugin = OtelPlugin(tracer_provider=provider)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("publish") as publish:
        async with lbs.Producer(r, service, plugins=[plugin], load_entrypoint_plugins=False) as p:
            (entry_id,) = await p.add_streams(["s1"])
    (fields,) = [f for _, f in await r.xrange(lbs.input_stream(service))]
    assert set(fields) == {b"lbs-input", b"traceparent"}  # no tracestate: it was empty

    async def handler(note: lbs.Notification) -> None:
        with tracer.start_as_current_span("inside"):
            pass

    await _run_until(_client(r, service, plugin), handler, 1)
    spans = exporter.get_finished_spans()
    trace_id = publish.get_span_context().trace_id
    (wait,) = named(spans, "lbs.wait")
    (handle,) = named(spans, "lbs.handle")
    (inside,) = named(spans, "inside")
    (done,) = named(spans, "lbs.done")
    assert {s.context.trace_id for s in (wait, handle, inside, done)} == {trace_id}
    assert wait.parent.span_id == handle.parent.span_id == publish.get_span_context().span_id  # type: ignore[union-attr]
    assert inside.parent.span_id == done.parent.span_id == handle.context.span_id  # type: ignore[union-attr]
    assert handle.kind is SpanKind.CONSUMER and handle.status.status_code is StatusCode.UNSET
    attrs = handle.attributes or {}
    assert attrs["lbs.stream"] == "s1" and attrs["lbs.entry_id"] == entry_id
    assert attrs["lbs.retry_count"] == 0 and isinstance(attrs["lbs.token"], int)
    assert attrs["lbs.service"] == service and attrs["lbs.consumer"] == "redis-consumer-otel"
    assert attrs["messaging.system"] == "lbs"
    assert attrs["messaging.destination.name"] == lbs.input_stream(service)
    assert (done.attributes or {})["lbs.done.status"] == "DONE"
    # The wait runs from the entry's id (when Redis added it) to the handler's start.
    assert wait.start_time == min(int(entry_id.split("-")[0]) * 1_000_000, handle.start_time)  # type: ignore[operator]
    assert wait.end_time == handle.start_time
    assert [e.name for e in wait.events] == ["lbs.taken"]


async def test_a_failed_attempt_is_linked_from_the_next_and_handed_back_in_its_trace(
    r: aioredis.Redis, service: str
) -> None:
    provider, exporter = memory_provider()
    plugin = OtelPlugin(tracer_provider=provider)
    with provider.get_tracer("test").start_as_current_span("publish") as publish:
        async with lbs.Producer(r, service, plugins=[plugin], load_entrypoint_plugins=False) as p:
            await p.add_stream("flaky")

    async def handler(note: lbs.Notification) -> None:
        if note.retry_count == 0:
            raise RuntimeError("first attempt fails")

    await _run_until(_client(r, service, plugin, retry_delay=0.0), handler, 1)
    spans = exporter.get_finished_spans()
    first, second = named(spans, "lbs.handle")
    (back,) = named(spans, "lbs.hand_back")
    (done,) = named(spans, "lbs.done")
    assert {s.context.trace_id for s in (first, second, back, done)} == {
        publish.get_span_context().trace_id
    }
    assert first.parent.span_id == second.parent.span_id == publish.get_span_context().span_id  # type: ignore[union-attr]
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (first.attributes or {})["error.type"] == "RuntimeError"
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert (second.attributes or {})["lbs.retry_count"] == 1
    assert back.parent.span_id == first.context.span_id  # type: ignore[union-attr]
    assert (back.attributes or {})["lbs.retry_counted"] is True
    assert done.parent.span_id == second.context.span_id  # type: ignore[union-attr]


async def test_out_of_retries_the_dead_letter_span_closes_the_last_attempt(
    r: aioredis.Redis, service: str
) -> None:
    provider, exporter = memory_provider()
    plugin = OtelPlugin(tracer_provider=provider)
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        await p.add_stream("doomed")  # untraced: the attempts are roots of their own traces

    async def handler(note: lbs.Notification) -> None:
        raise ValueError("never")

    c = _client(r, service, plugin, retry_delay=0.0, max_retries=1)
    runner = asyncio.create_task(c.run(handler))
    try:
        await lbs_eventually(lambda: bool(named(exporter.get_finished_spans(), "lbs.dead_letter")))
    finally:
        await c.close()
        await runner
    spans = exporter.get_finished_spans()
    first, second = named(spans, "lbs.handle")
    (letter,) = named(spans, "lbs.dead_letter")
    assert first.parent is None and second.parent is None
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert letter.parent.span_id == second.context.span_id  # type: ignore[union-attr]
    assert (letter.attributes or {})["lbs.dead_letter_id"]


async def lbs_eventually(check: Any, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.02)


async def test_with_the_api_alone_nothing_is_added_or_wrapped(
    r: aioredis.Redis, service: str
) -> None:
    plugin = OtelPlugin()  # the global provider: the API's proxy, nothing set up
    async with lbs.Producer(r, service, plugins=[plugin], load_entrypoint_plugins=False) as p:
        await p.add_stream("plain")
    assert [sorted(f) for _, f in await r.xrange(lbs.input_stream(service))] == [[b"lbs-input"]]

    async def handler(note: lbs.Notification) -> None:
        pass

    c = _client(r, service, plugin)
    assert plugin.lbs_wrap_handler(c, handler) is None  # not wrapped: nothing per call
    assert plugin.lbs_wrap_keyed_handler(c, _ignore_batch) is None
    await _run_until(c, handler, 1)


async def _ignore_batch(batch: lbs.KeyedBatch) -> None:
    pass


def test_context_of_reads_bytes_or_str_fields_and_refuses_garbage() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for fields in ({b"traceparent": tp.encode()}, {"traceparent": tp}):
        ctx = context_of(fields)
        assert ctx is not None
    assert context_of({}) is None
    assert context_of({b"traceparent": b"nonsense"}) is None
    assert LINK_FIELD == "lbs-link"


async def test_a_keyed_batch_span_is_the_child_of_one_producer_or_links_to_several(
    r: aioredis.Redis, service: str
) -> None:
    provider, exporter = memory_provider()
    plugin = OtelPlugin(tracer_provider=provider)
    tracer = provider.get_tracer("test")
    spans_of: dict[str, Any] = {}
    async with lbs.Publisher(r, service, plugins=[plugin], load_entrypoint_plugins=False) as pub:
        with tracer.start_as_current_span("a") as spans_of["a"]:
            await pub.publish_many([("one", {"n": 1}), ("one", {"n": 2})])
        for name in ("b", "c"):
            with tracer.start_as_current_span(name) as spans_of[name]:
                await pub.publish("two", {"n": name})
    failed = False

    async def handler(batch: lbs.KeyedBatch) -> None:
        nonlocal failed
        if batch.key == "two" and not failed:
            failed = True
            raise ValueError("first try")

    c = _client(r, service, plugin, retry_delay=0.01, retry_delay_max=0.02)
    await _run_until(c, handler, 2, keyed=True)
    batches = named(exporter.get_finished_spans(), "lbs.handle_batch")
    ctx = {name: span.get_span_context() for name, span in spans_of.items()}
    by_key: dict[str, list[Any]] = {}
    for span in batches:
        assert span.kind is SpanKind.CONSUMER
        by_key.setdefault(str((span.attributes or {})["lbs.stream"]), []).append(span)
    (one,) = by_key["one"]  # both messages, one producer: its child, no link
    assert one.parent is not None and one.parent.span_id == ctx["a"].span_id and not one.links
    attrs = one.attributes or {}
    assert attrs["messaging.batch.message_count"] == 2 and attrs["lbs.retry_count"] == 0
    assert attrs["lbs.service"] == service and isinstance(attrs["lbs.token"], int)
    first, *retries = by_key["two"]  # two producers: a root span linked to both
    assert first.parent is None
    assert [link.context.span_id for link in first.links] == [ctx["b"].span_id, ctx["c"].span_id]
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "ValueError"
    assert [e.name for e in first.events] == ["exception"]
    # The failed batch taken apart: one message a hold, each the child of its own producer.
    assert [s.parent and s.parent.span_id for s in retries] == [ctx["b"].span_id, ctx["c"].span_id]
    assert all((s.attributes or {})["lbs.retry_count"] >= 1 for s in retries[:1])
