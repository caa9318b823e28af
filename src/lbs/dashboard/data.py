"""Everything the dashboard reads from Redis, async, on the operator's API: a service's status
(:func:`lbs.status.collect_status`), a sharded service's shards with their slots and masters
(:func:`lbs.status.collect_shards`), the services there are (:func:`lbs.status.service_summaries`),
its dead letters (:class:`lbs.deadletters.DeadLetters`), its
journal (``lbs.events.read_events``: tallies, recoveries), the streams matching a search, its pause
(:func:`read_pause`) and who holds an entry (:func:`held_entry`).

No I/O outside the functions that take a client; the journal's reductions (:func:`tally_series`,
:func:`recovery_timeline`) are pure. A journal that is off or empty is not an error: the pages say
there is no history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from _lbscore import try_decode_input

from .. import _keys
from .._admin import on_owner
from .._redis.wire import fields_text, text
from .._streamids import id_ms
from ..config import Config
from ..controls import PauseState
from ..events import Event, read_events
from ..exceptions import LbsError
from ..status import ServiceStatus, ServiceSummary, ShardedStatus, collect_shards, collect_status
from ..status.services import list_services, service_summaries

__all__ = [
    "NO_HISTORY",
    "SERVICES_LISTED",
    "Incident",
    "Retake",
    "Series",
    "StreamRow",
    "held_entry",
    "read_journal",
    "read_pause",
    "read_services",
    "read_shards",
    "read_status",
    "recovery_timeline",
    "search_streams",
    "tally_series",
]

Client = aioredis.Redis | RedisCluster

#: What a chart or the recovery page says when the journal has nothing to show.
NO_HISTORY = "no tallies in the last hour (nothing handled, or the journal is off)"
MINUTE_MS = 60_000
#: Recoveries of one holder further apart than this are two incidents.
INCIDENT_GAP_MS = 30_000


async def read_status(
    client: Client, service: str, config: Config, *, letters: int = 100, sample: int = 200
) -> ServiceStatus:
    """The service's status (:func:`lbs.status.collect_status`, two round trips and more when held)."""
    return await collect_status(client, service, config=config, letters=letters, sample=sample)


async def read_shards(
    client: Client, service: str, shards: int, config: Config, *, letters: int = 100
) -> ShardedStatus:
    """Every shard of ``service`` (its status, slot and master) and the legacy shards that still
    exist (:func:`lbs.status.collect_shards`)."""
    return await collect_shards(client, service, shards, config=config, letters=letters)


#: Services the home page lists with their counts (the first, by name; the others are counted).
SERVICES_LISTED = 50


async def read_services(
    client: Client,
    config: Config,
    *,
    limit: int = SERVICES_LISTED,
    first: Sequence[str] = (),
) -> tuple[list[ServiceSummary], int]:
    """The services on the dashboard's Redis (every master of a cluster), the first ``limit`` with
    their counts (:func:`lbs.status.service_summaries`): those of ``first`` (the dashboard's own)
    that exist, then the others by name; and how many there are."""
    names = await list_services(client)
    present = set(names)
    mine = [n for n in dict.fromkeys(first) if n in present]
    ordered = mine + [n for n in names if n not in set(mine)]
    return await service_summaries(client, config=config, names=ordered[:limit]), len(names)


async def read_journal(
    client: Client,
    service: str,
    *,
    since_ms: int | None = None,
    kinds: Sequence[str] | None = None,
    count: int = 20_000,
) -> list[Event]:
    """The service's journal events (:func:`lbs.events.read_events`) from ``since_ms`` on, oldest
    first; none when the journal is off (``Config(journal=False)``) or nothing was written yet."""
    return await read_events(client, service, since_ms=since_ms, count=count, kinds=kinds)


@dataclass(frozen=True)
class Series:
    """Per-minute sums of the consumers' tallies, the oldest minute first (the last is the current one)."""

    start_ms: int
    done: tuple[int, ...]
    failed: tuple[int, ...]
    #: Whether any tally was read (False: nothing to draw, say why).
    any: bool

    @property
    def minutes(self) -> int:
        return len(self.done)

    def to_dict(self) -> dict[str, Any]:
        return {"start_ms": self.start_ms, "done": list(self.done), "failed": list(self.failed)}


def _int(fields: dict[str, str], name: str) -> int:
    try:
        return int(fields.get(name, "0"))
    except ValueError:
        return 0


def tally_series(events: Iterable[Event], now_ms: int, minutes: int = 60) -> Series:
    """The ``tally`` events' ``done`` and ``failed`` summed per minute over the ``minutes`` up to ``now_ms``."""
    start = (now_ms // MINUTE_MS - minutes + 1) * MINUTE_MS
    done, failed = [0] * minutes, [0] * minutes
    seen = False
    for ev in events:
        if ev.kind != "tally":
            continue
        i = (ev.time_ms - start) // MINUTE_MS
        if 0 <= i < minutes:
            seen = True
            done[i] += _int(ev.fields, "done")
            failed[i] += _int(ev.fields, "failed")
    return Series(start, tuple(done), tuple(failed), seen)


@dataclass
class Retake:
    """One stream a dead holder's recovery put back, and who took it."""

    stream: str
    entry_id: str
    new_entry_id: str
    #: Which recovery path found it (the journal's ``path``: deadline, keyspace, scan ...).
    path: str
    recovered_ms: int
    #: The holder's deadline (its lease's expiry, ms of the server's clock); None when not recorded.
    deadline_ms: int | None
    #: The consumer that recovered it.
    recoverer: str
    retry_count: int = 0
    taken_by: str = ""
    taken_ms: int | None = None

    @property
    def took_ms(self) -> int | None:
        """From the holder's deadline (else the recovery) to its being taken again; None if not yet."""
        if self.taken_ms is None:
            return None
        return self.taken_ms - (self.deadline_ms if self.deadline_ms else self.recovered_ms)


@dataclass
class Incident:
    """A holder declared dead: the streams its recovery put back, and who took them."""

    holder: str
    declared_ms: int
    streams: list[Retake] = field(default_factory=list)

    @property
    def recoverers(self) -> list[str]:
        return sorted({r.recoverer for r in self.streams})

    @property
    def slowest_ms(self) -> int | None:
        took = [r.took_ms for r in self.streams if r.took_ms is not None]
        return max(took) if took else None

    @property
    def retaken(self) -> int:
        return sum(1 for r in self.streams if r.taken_ms is not None)


@dataclass(frozen=True)
class Moment:
    """A journal event of the timeline other than a recovery: a consumer started, stopped, disowned."""

    time_ms: int
    kind: str
    consumer: str
    detail: str


def recovery_timeline(events: Iterable[Event]) -> list[Incident | Moment]:
    """Incidents (``recovered`` events by holder, each stream joined to the ``retaken`` event whose
    ``original_id`` (or ``entry_id``) is its ``new_entry_id``) and the ``started``/``stopped``/``disowned``
    moments, newest first."""
    events = list(events)
    taken: dict[str, Event] = {}
    for ev in events:
        if ev.kind == "retaken":
            for ref in (ev.fields.get("entry_id", ""), ev.fields.get("original_id", "")):
                taken.setdefault(ref, ev)
    open_: dict[str, Incident] = {}
    out: list[Incident | Moment] = []
    for ev in events:
        f = ev.fields
        if ev.kind == "recovered":
            holder = f.get("holder", "") or "?"
            inc = open_.get(holder)
            last = inc.streams[-1].recovered_ms if inc and inc.streams else None
            if inc is None or last is None or ev.time_ms - last > INCIDENT_GAP_MS:
                inc = open_[holder] = Incident(holder, ev.time_ms)
                out.append(inc)
            deadline = _int(f, "deadline_ms") or None
            row = Retake(
                f.get("stream", ""),
                f.get("entry_id", ""),
                f.get("new_entry_id", ""),
                f.get("path", ""),
                ev.time_ms,
                deadline,
                ev.consumer,
                _int(f, "retry_count"),
            )
            got = taken.get(row.new_entry_id) if row.new_entry_id else None
            if got is not None:
                row.taken_by, row.taken_ms = got.consumer, got.time_ms
            inc.streams.append(row)
        elif ev.kind in ("started", "stopped", "disowned"):
            detail = f.get("stream", "") if ev.kind == "disowned" else ""
            out.append(Moment(ev.time_ms, ev.kind, ev.consumer, detail))
    return sorted(
        out, key=lambda x: x.declared_ms if isinstance(x, Incident) else x.time_ms, reverse=True
    )


@dataclass(frozen=True)
class StreamRow:
    """A data stream (or key) found by a search, and where it is."""

    name: str
    #: ``held``, ``waiting`` (registered, not yet delivered), ``parked`` (a retry not yet due),
    #: ``waiting for holder`` (a second registration of a held name) or ``key`` (keyed processing).
    where: str
    entry_id: str = ""
    consumer: str = ""
    token: int | None = None
    age_ms: int | None = None
    idle_ms: int | None = None
    #: A key's backlog, committed position and tries (keyed processing).
    backlog: int | None = None
    position: str = ""
    tries: int | None = None
    retry_count: int | None = None


def _names(rows: Any, prefix: str, now_ms: int, where: str) -> list[StreamRow]:
    out = []
    for entry_id, fields in rows or ():
        eid, ftext = text(entry_id, "replace"), fields_text(fields)
        name, _, _ = try_decode_input(ftext.get(_keys.INPUT_FIELD))
        retry = ftext.get(prefix + "retry_count", "0")
        shown = where
        if name is None and "lbs-publish" in ftext:
            # Publisher's delay=: one parked entry per call and shard, its keys' messages in it
            # (promote-4.lua's layout: lbs-publish <count>, then <key> <registration>, ...).
            pairs = list(ftext)
            name, shown = (pairs[1] if len(pairs) > 1 else "?"), f"{where} (delayed messages)"
        out.append(
            StreamRow(
                name if name is not None else "(malformed)",
                shown,
                eid,
                age_ms=max(0, now_ms - id_ms(eid)),
                retry_count=int(retry) if retry.isdigit() else 0,
            )
        )
    return out


async def search_streams(
    client: Client, st: ServiceStatus, config: Config, query: str, *, scan: int = 500
) -> tuple[list[StreamRow], int]:
    """The streams of ``st`` whose name contains ``query`` (case-insensitive; "" for all): held ones and
    held keys (from the status), names waiting for their holder, and among the first ``scan``
    registrations not yet delivered and the first ``scan`` parked retries. Also how many entries were
    scanned in Redis (the rest of a long backlog is not searched)."""
    q = query.casefold()
    rows: list[StreamRow] = []
    for c in st.consumers:
        for h in c.held:
            rows.append(
                StreamRow(h.stream, "held", h.entry_id, c.name, h.token, h.age_ms, h.idle_ms)
            )
    for k in st.keys:
        rows.append(
            StreamRow(
                k.key,
                "key",
                k.entry_id,
                k.consumer,
                backlog=k.backlog,
                position=k.position or "-",
                tries=k.tries,
            )
        )
    for w in st.waiting_names:
        rows.append(StreamRow(w.name, "waiting for holder", w.holder, backlog=w.waiting))
    scanned = 0
    if st.exists:
        async with on_owner(client, st.stream) as (r, _):
            pipe = r.pipeline(transaction=False)
            start = "(" + st.last_delivered_id if st.last_delivered_id else "-"
            pipe.xrange(st.stream, start, "+", count=scan)
            pipe.xrange(_keys.delayed_stream(st.service), "-", "+", count=scan)
            waiting, parked = await pipe.execute(raise_on_error=False)
        for where, reply in (("waiting", waiting), ("parked", parked)):
            if not isinstance(reply, Exception):
                scanned += len(reply)
                rows += _names(reply, config.field_prefix, st.time_ms, where)
    return [row for row in rows if q in row.name.casefold()], scanned


async def read_pause(client: Client, service: str) -> PauseState | None:
    """The service's pause (:meth:`lbs.ServiceControls.paused`, in one round trip), or None: not
    paused, or not readable now (a page shows no banner rather than fail)."""
    key = _keys.paused_key(service)
    try:
        async with on_owner(client, key) as (r, _):
            pipe = r.pipeline(transaction=False)
            pipe.type(key)
            pipe.hgetall(key)
            kind, raw = await pipe.execute(raise_on_error=False)
    except (LbsError, RedisError, OSError):
        return None
    if isinstance(kind, Exception) or text(kind, "replace") == "none":
        return None
    if isinstance(raw, Exception) or not isinstance(raw, dict):  # consumers count it as a pause
        return PauseState("?", f"{key} holds a {text(kind, 'replace')} (resume deletes it)", 0)
    fields = {text(k, "replace"): text(v, "replace") for k, v in raw.items()}
    since = fields.get("since_ms", "0")
    return PauseState(
        fields.get("by", "?"), fields.get("reason", ""), int(since) if since.isdigit() else 0
    )


async def held_entry(client: Client, service: str, entry_id: str) -> tuple[str, str] | None:
    """The data stream of the LBS entry ``entry_id`` and the consumer it is pending to (XPENDING and
    XRANGE in one round trip); None when it is not pending."""
    stream = _keys.input_stream(service)
    async with on_owner(client, stream) as (r, _):
        pipe = r.pipeline(transaction=False)
        pipe.xpending_range(stream, _keys.group_name(service), entry_id, entry_id, 1)
        pipe.xrange(stream, entry_id, entry_id, count=1)
        pending, found = await pipe.execute(raise_on_error=False)
    if isinstance(pending, Exception) or not pending:
        return None
    name = None
    if not isinstance(found, Exception) and found:
        name, _, _ = try_decode_input(fields_text(found[0][1]).get(_keys.INPUT_FIELD))
    return (name if name is not None else "(malformed)"), text(pending[0]["consumer"], "replace")


class Fleet:
    """The services a dashboard shows and the one Redis client it reads them with (opened on first
    use, in the serving event loop; closed by :meth:`aclose`)."""

    def __init__(self, url: str, services: Sequence[str], config: Config) -> None:
        self.url = url
        self.services = tuple(services)
        self.config = config
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            from .._redis.connection import resolve_client

            self._client, _ = resolve_client(self.url)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
