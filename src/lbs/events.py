"""The journal of a service: what happened in it, as every consumer wrote it, read back.

Each consumer (``Config.journal``, on by default) adds events to the capped
stream ``{<service>-input}:events`` (``XADD MAXLEN ~ Config.journal_maxlen``;
one per LBS shard, in the shard's slot). Every entry has the fields ``kind``
and ``consumer`` (who wrote it), then the kind's own, all text:

========================  ===============================================================
``started``               a consumer process started: ``pid``, ``host``, ``version``, and
                          what its plugins say of it (``lbs_process_info``: ``metrics``,
                          the URL of its Prometheus metrics, from ``lbs-prometheus``)
``stopped``               ... and closed: ``pid``, ``host``, ``version``, ``handed_back``
``tally``                 counts since the writer's previous tally (written every
                          ``Config.journal_interval`` while one is not zero): ``done``
                          (streams finished), ``failed`` (handlers that raised or timed
                          out), ``dead_lettered``, ``recovered`` (streams its recovery
                          put back), ``keyed`` (keyed messages committed),
                          ``unlisted`` (failures past the per-flush bound, counted only
                          here), ``dropped`` (events it could not write), ``interval_ms``
``failed``                a handler raised or timed out: ``stream``, ``entry_id``,
                          ``token``, ``retry_count`` (before this failure), ``reason``,
                          ``traceback`` (at most 8 KB; empty for a timeout)
``dead_lettered``         ``stream`` (empty when undecodable), ``entry_id``, ``reason``,
                          ``dead_letter_id`` (empty when dead letters are dropped)
``recovered``             the writer's recovery put a stream back: ``holder`` (the dead or
                          stalled consumer; empty when unknown), ``stream``, ``entry_id``,
                          ``new_entry_id``, ``retry_count``, ``path`` (``deadline``,
                          ``keyspace``, ``scan``, ``startup``, ``claim``, ``heartbeat``),
                          ``deadline_ms`` (the holder's deadline, server ms; empty when
                          unknown)
``retaken``               the writer took a re-queued copy (a retry, or a dead holder's
                          stream): ``stream``, ``entry_id`` (the copy's), ``original_id``
                          (the registration's first entry), ``retry_count``, ``token``
``disowned``              the writer lost a stream it held: ``stream``, ``entry_id``,
                          ``token``, ``reason``
``paused``                an operator paused the service (:class:`lbs.ServiceControls`;
                          ``consumer`` and ``by`` name the operator): ``reason``
``resumed``               ... and resumed it: ``by``
``released``              the writer handed a stream back at an operator's order (its
                          handler cancelled, no retry counted): ``stream``, ``entry_id``,
                          ``token``, ``by``, ``reason``, ``new_entry_id``
``cancelled``             ... or dead-lettered it: the same, ``dead_letter_id`` for
                          ``new_entry_id``
``force_claimed``         an operator re-queued a held stream whatever its holder:
                          ``by``, ``reason``, ``entry_id``, ``holder``, ``outcome``, ``detail``
``dropped``               the writer let go of a stream an operator force-claimed (its
                          handler cancelled): ``stream``, ``entry_id``, ``token``, ``by``
========================  ===============================================================

An event's time is its id's (the server's clock). A recovery's story: the
``recovered`` events name the holder and its deadline; the ``retaken`` event
whose ``entry_id`` is a ``recovered`` event's ``new_entry_id`` names who took
the stream over, and when.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from . import _keys
from ._admin import on_owner
from ._redis.connection import ClusterMode, RedisLike, resolve_client
from ._redis.errors import KeyTypeError, WrongTypeError, replied
from ._redis.wire import fields_text, text
from ._streamids import id_key, id_ms
from .exceptions import ConfigurationError, LbsError, RedisOperationError

__all__ = ["KINDS", "Event", "read_events"]

#: Every kind of event, in the order of the table above.
KINDS = (
    "started",
    "stopped",
    "tally",
    "failed",
    "dead_lettered",
    "recovered",
    "retaken",
    "disowned",
    "paused",
    "resumed",
    "released",
    "cancelled",
    "force_claimed",
    "dropped",
)

#: Entries read per XREVRANGE while a kind filter skips some.
PAGE = 500


@dataclass(frozen=True, slots=True)
class Event:
    """One journal entry: its stream ``id``, its time (``time_ms``, from the id), ``kind``, the
    ``consumer`` that wrote it and the kind's own ``fields`` (see :mod:`lbs.events`)."""

    id: str
    time_ms: int
    kind: str
    consumer: str
    fields: dict[str, str]

    @classmethod
    def of(cls, entry_id: str, raw: Any) -> Event:
        """An event from an XRANGE entry (its fields as Redis returned them)."""
        fields = fields_text(raw)
        kind = fields.pop("kind", "")
        consumer = fields.pop("consumer", "")
        return cls(entry_id, id_ms(entry_id), kind, consumer, fields)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "id": self.id,
            "time_ms": self.time_ms,
            "kind": self.kind,
            "consumer": self.consumer,
            "fields": dict(self.fields),
        }


async def read_events(
    redis: RedisLike,
    service: str,
    *,
    since_ms: int | None = None,
    count: int = 1000,
    kinds: Collection[str] | None = None,
    shards: int = 1,
    cluster: bool | ClusterMode = ClusterMode.NONE,
) -> list[Event]:
    """The newest ``count`` events of ``service`` (of ``kinds`` only, when given; at or after
    ``since_ms``, server ms, when given), oldest first; over every shard of a sharded LBS.

    ``redis`` is a redis.asyncio client, a ``RedisCluster`` (or
    ``cluster=True``) or a URL (opened and closed here); on a cluster each
    shard's slot owner is asked. No journal yet is no events. A key of the
    wrong type raises :class:`lbs.RedisOperationError` naming it, as does a
    failing Redis; a bad argument :class:`lbs.ConfigurationError`.
    """
    _keys.validate_service(service)
    _keys.check_shards(shards)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ConfigurationError(f"count must be an integer >= 0, got {count!r}")
    if since_ms is not None and (
        not isinstance(since_ms, int) or isinstance(since_ms, bool) or since_ms < 0
    ):
        raise ConfigurationError(f"since_ms must be an integer >= 0 or None, got {since_ms!r}")
    if isinstance(kinds, str):
        raise ConfigurationError("kinds must be a collection of kinds, not one string")
    wanted = None if kinds is None else frozenset(kinds)
    client, owned = resolve_client(redis, cluster=cluster)
    out: list[Event] = []
    try:
        for shard in _keys.shard_services(service, shards):
            out += await _read(client, _keys.events_stream(shard), since_ms, count, wanted)
    except LbsError:
        raise
    except RedisError as exc:
        raise RedisOperationError("events", exc) from exc
    finally:
        if owned:
            await client.aclose()
    out.sort(key=lambda e: id_key(e.id))
    return out[len(out) - count :] if count else []


async def _read(
    client: Any, key: str, since_ms: int | None, count: int, wanted: frozenset[str] | None
) -> list[Event]:
    """One shard's newest ``count`` events, newest first."""
    start = "-" if since_ms is None else f"{since_ms}-0"
    out: list[Event] = []
    async with on_owner(client, key) as (r, _):
        end = "+"
        while len(out) < count:
            want = count - len(out) if wanted is None else max(PAGE, count - len(out))
            try:
                page = await replied(r.xrevrange(key, end, start, count=want)) or []
            except WrongTypeError as exc:
                kind = text(await r.type(key))
                raise RedisOperationError(
                    "events", KeyTypeError(f"LBSKEY {key} holds a {kind}, not the journal")
                ) from exc
            for raw_id, raw in page:
                event = Event.of(text(raw_id), raw)
                if wanted is None or event.kind in wanted:
                    out.append(event)
            if len(page) < want:
                break
            end = "(" + text(page[-1][0])
    return out[:count]
