"""The plugin: W3C trace context into every registration, and spans around each assignment.

Producer side, :meth:`OtelPlugin.lbs_message_fields`: the span current when ``add_stream``,
``add_streams`` or ``publish`` is called goes into every entry (or message) of the call as the
W3C fields ``traceparent`` (and ``tracestate`` when it has one). No valid span, no fields.

Consumer side, only for clients whose tracer provider is a real one (an SDK's) when the client
first needs it; otherwise every hook returns at once and ``run()``'s handler is not wrapped:

* ``lbs.wait`` (from the entry's id, when Redis added it, to the handler's start; an event
  ``lbs.taken`` marks the read) and ``lbs.handle`` (the handler, kind CONSUMER): children of
  the entry's context; a copy handed back after a failed attempt carries that attempt's span
  in ``lbs-link``, and the next attempt's ``lbs.handle`` links to it;
* ``lbs.done`` (the finishing batch), ``lbs.hand_back``, ``lbs.dead_letter``: children of
  the attempt's ``lbs.handle``, from the handler's end to the outcome;
* ``lbs.requeue``: this client's recovery put a stream back (a dead holder's; or its own,
  path ``heartbeat``), a root span unless the attempt was this client's;
* ``lbs.handle_batch`` (a ``run_keyed()`` handler, kind CONSUMER): the child of its messages'
  producer context when they share one, else a root span linked to each of theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import lbs

log = logging.getLogger("lbs_otel")

#: The W3C trace context fields a producer adds (https://www.w3.org/TR/trace-context/).
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
#: The field a handed-back copy carries: the failed attempt's ``lbs.handle`` span, as a traceparent.
LINK_FIELD: Final = "lbs-link"
#: ``messaging.system`` of every span: the LBS protocol on Redis Streams.
SYSTEM: Final = "lbs"
#: The attempts remembered per client (handler ended, outcome not heard yet), oldest dropped past it.
MAX_ATTEMPTS: Final = 10_000
#: The most links an ``lbs.handle_batch`` span gets (one per distinct producer context, in order).
MAX_BATCH_LINKS: Final = 128

Handler = Callable[[lbs.Notification], Awaitable[Any]]
KeyedHandler = Callable[[lbs.KeyedBatch], Awaitable[Any]]
_EMPTY = otel_context.Context()
_W3C = TraceContextTextMapPropagator()


def context_of(fields: Mapping[Any, Any]) -> otel_context.Context | None:
    """The trace context an entry's or a message's fields carry (``traceparent``, ``tracestate``;
    names and values as bytes or str), or None. For handlers outside ``run()``:
    ``context_of(client.find_held(note.stream, note.entry_id).fields)``, or a keyed message's
    ``fields``."""
    carrier = _carrier(fields, TRACEPARENT, TRACESTATE)
    if TRACEPARENT not in carrier:
        return None
    ctx = _W3C.extract(carrier, context=_EMPTY)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def _parent_of(fields: Mapping[Any, Any]) -> otel_context.Context | None:
    """:func:`context_of` of a held entry's fields (bytes) or a keyed message's (str), the common
    case (a version-00 traceparent, no tracestate) read without the propagator's regular
    expressions."""
    raw = fields.get(b"traceparent")
    if raw is None:
        raw = fields.get(TRACEPARENT)  # a keyed message's fields (str)
    if isinstance(raw, str):
        raw = raw.encode("ascii", "replace")
    if (
        not isinstance(raw, bytes)
        or len(raw) != 55
        or b"tracestate" in fields
        or TRACESTATE in fields
    ):
        return context_of(fields) if raw is not None else None
    value: bytes = raw
    try:
        if value[:3] != b"00-" or value[35:36] != b"-" or value[52:53] != b"-":
            raise ValueError
        span = SpanContext(
            int(value[3:35], 16), int(value[36:52], 16), True, TraceFlags(int(value[53:], 16))
        )
    except ValueError:
        return context_of(fields)
    if not span.is_valid:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(span), _EMPTY)


def _carrier(fields: Mapping[Any, Any], *names: str) -> dict[str, str]:
    out = {}
    for name in names:
        value = fields.get(name.encode(), fields.get(name))
        if value is not None:
            out[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return out


def _traceparent(span: SpanContext) -> str:
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"


def _linked(fields: Mapping[Any, Any]) -> list[Link]:
    """A Link to the earlier attempt a handed-back copy names (``lbs-link``), or none."""
    value = _carrier(fields, LINK_FIELD).get(LINK_FIELD)
    if not value:
        return []
    span = trace.get_current_span(_W3C.extract({TRACEPARENT: value}, context=_EMPTY))
    ctx = span.get_span_context()
    return [Link(ctx, {"lbs.link": "previous attempt"})] if ctx.is_valid else []


def _batch_context(
    messages: Sequence[Any],
) -> tuple[otel_context.Context, list[Link]]:
    """A keyed batch's parent and links: the producer's context of each message, distinct, in order
    (at most :data:`MAX_BATCH_LINKS`). One context for all: the span is its child and links to
    none; several: a root span linked to each, as a consumer of a batch is in OpenTelemetry's
    messaging conventions."""
    contexts: dict[tuple[int, int], SpanContext] = {}
    parsed: set[tuple[str, str | None]] = set()  # a batch's messages mostly share one value
    for m in messages:
        fields = m.fields
        value = fields.get(TRACEPARENT)
        if value is None:
            continue
        raw = (value, fields.get(TRACESTATE))
        if raw in parsed:
            continue
        parsed.add(raw)
        ctx = _parent_of(fields)
        if ctx is not None:
            span = trace.get_current_span(ctx).get_span_context()
            contexts.setdefault((span.trace_id, span.span_id), span)
            if len(contexts) > MAX_BATCH_LINKS:
                break
    if len(contexts) == 1:
        (only,) = contexts.values()
        return trace.set_span_in_context(trace.NonRecordingSpan(only), _EMPTY), []
    return _EMPTY, [Link(c) for c in list(contexts.values())[:MAX_BATCH_LINKS]]


@contextlib.contextmanager
def _current(span: Any, parent: otel_context.Context) -> Iterator[None]:
    """A handler's run in ``span`` (the current span meanwhile), ended after it. What it raises is
    recorded: status ERROR, ``error.type``, the exception (a cancellation is only named)."""
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    try:
        yield
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__qualname__)
        if isinstance(exc, asyncio.CancelledError):
            span.set_status(Status(StatusCode.ERROR, "cancelled"))
        else:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _entry_ns(entry_id: str) -> int | None:
    """When Redis added the entry (its id's milliseconds), in ns since the epoch."""
    ms, _, _seq = entry_id.partition("-")
    return int(ms) * 1_000_000 if ms.isdigit() else None


def _real(provider: object) -> bool:
    return not isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))


@dataclass(slots=True)
class _Attempt:
    """One handler run whose outcome (done, hand-back, dead letter) is still to come."""

    span: SpanContext  # its lbs.handle
    ended_ns: int


@dataclass(slots=True)
class _Client:
    """What the plugin keeps per client."""

    active: bool
    attributes: dict[str, str]
    attempts: dict[str, _Attempt] = field(default_factory=dict)

    def remember(self, entry_id: str, attempt: _Attempt) -> None:
        self.attempts[entry_id] = attempt
        if len(self.attempts) > MAX_ATTEMPTS:
            self.attempts.pop(next(iter(self.attempts)))


class OtelPlugin:
    """Traces lbs producers and consumers through the OpenTelemetry API.

    ``tracer_provider``: where spans go (default: the global one, read when a client first
    needs it). Installed, :data:`lbs_otel.default_plugin` is this with the defaults. One
    instance serves every client and sender of the process.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._provider = tracer_provider
        self._tracer: Tracer = trace.get_tracer(
            "lbs_otel", lbs.__version__, tracer_provider=tracer_provider
        )
        self._clients: weakref.WeakKeyDictionary[lbs.Client, _Client] = weakref.WeakKeyDictionary()

    # ---------------------------------------------------------- producer ---

    @lbs.hookimpl
    def lbs_message_fields(self) -> dict[str, str] | None:
        """The current span's context, for every entry of this send (none without a valid span)."""
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        return carrier

    # ---------------------------------------------------------- consumer ---

    def _of(self, client: lbs.Client) -> _Client:
        state = self._clients.get(client)
        if state is None:
            provider = self._provider or trace.get_tracer_provider()
            attributes = {
                "messaging.system": SYSTEM,
                "messaging.destination.name": client.stream_key,
                "messaging.consumer.group.name": client.group,
                "messaging.client.id": client.id,
                "lbs.service": client.service,
                "lbs.consumer": client.id,
            }
            state = self._clients[client] = _Client(_real(provider), attributes)
            if not state.active:
                log.debug("lbs-otel: no tracer provider set for %s; not tracing it", client.id)
        return state

    @lbs.hookimpl
    def lbs_wrap_handler(self, client: lbs.Client, handler: Handler) -> Handler | None:
        state = self._of(client)
        if not state.active:
            return None  # nothing per call
        tracer = self._tracer

        async def traced(note: lbs.Notification) -> Any:
            held = client.find_held(note.stream, note.entry_id)
            fields = held.fields if held is not None else {}
            parent = (_parent_of(fields) if fields else None) or _EMPTY
            attributes: dict[str, Any] = {
                **state.attributes,
                "messaging.operation.type": "process",
                "messaging.operation.name": "handle",
                "messaging.message.id": note.entry_id,
                "lbs.stream": note.stream,
                "lbs.entry_id": note.entry_id,
                "lbs.token": note.token,
                "lbs.retry_count": note.retry_count,
            }
            start = time.time_ns()
            queued = _entry_ns(note.entry_id)
            if queued is not None:
                wait = tracer.start_span(  # few attributes: the SDK checks each, per span
                    "lbs.wait",
                    parent,
                    attributes={"lbs.stream": note.stream, "lbs.entry_id": note.entry_id},
                    start_time=min(queued, start),
                )
                if held is not None:
                    taken = start - int((time.monotonic() - held.taken_at) * 1e9)
                    wait.add_event("lbs.taken", timestamp=max(min(queued, start), taken))
                wait.end(end_time=start)
            span = tracer.start_span(
                "lbs.handle",
                parent,
                SpanKind.CONSUMER,
                attributes,
                _linked(fields) if fields else None,
                start_time=start,
            )
            try:
                with _current(span, parent):
                    return await handler(note)
            finally:
                state.remember(note.entry_id, _Attempt(span.get_span_context(), time.time_ns()))

        return traced

    @lbs.hookimpl
    def lbs_wrap_keyed_handler(
        self, client: lbs.Client, handler: KeyedHandler
    ) -> KeyedHandler | None:
        state = self._of(client)
        if not state.active:
            return None  # nothing per call
        tracer = self._tracer

        async def traced(batch: lbs.KeyedBatch) -> Any:
            messages = batch.messages
            parent, links = _batch_context(messages)
            attributes: dict[str, Any] = {
                **state.attributes,
                "messaging.operation.type": "process",
                "messaging.operation.name": "handle",
                "messaging.batch.message_count": len(messages),
                "lbs.stream": batch.key,
                "lbs.entry_id": batch.entry_id,
                "lbs.token": batch.token,
                "lbs.retry_count": batch.retry_count,
            }
            if messages:
                attributes["lbs.first_message_id"] = messages[0].id
                attributes["lbs.last_message_id"] = messages[-1].id
            span = tracer.start_span(
                "lbs.handle_batch", parent, SpanKind.CONSUMER, attributes, links
            )
            with _current(span, parent):
                return await handler(batch)

        return traced

    def _outcome(
        self,
        state: _Client,
        name: str,
        entry_id: str,
        attributes: Mapping[str, Any],
        parent: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.CLIENT,
        full: bool | None = True,
    ) -> None:
        """A span for what became of an attempt: the child of its lbs.handle (from the handler's
        end to now) when this client ran it, else of ``parent`` (empty: a root span), now.
        ``full``: with the client's attributes (None: only when it is not lbs.handle's child,
        whose attributes say whose it is)."""
        attempt = state.attempts.pop(entry_id, None)
        now = time.time_ns()
        start = now
        if attempt is not None:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(attempt.span), _EMPTY)
            start = min(attempt.ended_ns, now)
        elif full is None:
            full = True  # a span of its own: it says whose it is
        span = self._tracer.start_span(
            name,
            parent or _EMPTY,
            kind,
            {**state.attributes, "lbs.entry_id": entry_id, **attributes}
            if full
            else {"lbs.entry_id": entry_id, **attributes},
            start_time=start,
        )
        span.end(end_time=now)

    @lbs.hookimpl
    def lbs_locks_released(
        self, client: lbs.Client, released: Sequence[tuple[lbs.Held, lbs.DoneStatus]]
    ) -> None:
        state = self._of(client)
        if not state.active:
            return
        for held, status in released:
            if held.entry_id not in state.attempts:
                fields = held.fields  # outside run(): traced only when the entry carries a context
                parent = _parent_of(fields) if fields else None
                if parent is None:
                    continue
            else:
                parent = None
            self._outcome(
                state,
                "lbs.done",
                held.entry_id,
                {"lbs.stream": held.stream, "lbs.done.status": status.name},
                parent,
                full=None,  # per assignment: lbs.handle, its parent, has the rest
            )

    @lbs.hookimpl
    def lbs_hand_back_fields(self, client: lbs.Client, held: lbs.Held) -> dict[str, str] | None:
        """The failed attempt's lbs.handle, for the next attempt's Link."""
        state = self._of(client)
        attempt = state.attempts.get(held.entry_id) if state.active else None
        return None if attempt is None else {LINK_FIELD: _traceparent(attempt.span)}

    @lbs.hookimpl
    def lbs_stream_handed_back(
        self,
        client: lbs.Client,
        stream: str,
        entry_id: str,
        new_entry_id: str,
        retry_counted: bool,
    ) -> None:
        state = self._of(client)
        if state.active:
            self._outcome(
                state,
                "lbs.hand_back",
                entry_id,
                {
                    "messaging.operation.type": "settle",
                    "messaging.operation.name": "hand_back",
                    "lbs.stream": stream,
                    "lbs.new_entry_id": new_entry_id,
                    "lbs.retry_counted": retry_counted,
                },
            )

    @lbs.hookimpl
    def lbs_stream_dead_lettered(
        self, client: lbs.Client, entry_id: str, reason: str, dead_letter_id: str
    ) -> None:
        state = self._of(client)
        if state.active:
            self._outcome(
                state,
                "lbs.dead_letter",
                entry_id,
                {
                    "messaging.operation.type": "settle",
                    "messaging.operation.name": "dead_letter",
                    "lbs.dead_letter_id": dead_letter_id,
                    "lbs.reason": reason[:500],
                },
            )

    @lbs.hookimpl
    def lbs_stream_expired(
        self,
        client: lbs.Client,
        stream: str,
        entry_id: str,
        new_entry_id: str,
        retry_count: int,
        path: str,
    ) -> None:
        state = self._of(client)
        if state.active:
            self._outcome(
                state,
                "lbs.requeue",
                entry_id,
                {
                    "messaging.operation.name": "requeue",
                    "lbs.stream": stream,
                    "lbs.new_entry_id": new_entry_id,
                    "lbs.retry_count": retry_count,
                    "lbs.recovery.path": path,
                },
                kind=SpanKind.INTERNAL,
            )
