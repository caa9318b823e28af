"""How a read over many streams becomes Spark partitions, and how a streaming query finds its streams.

Thousands of per-session streams of a few entries each are what lbs exists
for; one Spark task per stream would be thousands of tiny tasks, each paying
a task's start. A plan packs the streams' ranges, grouped by the node that
owns them (one connection a task), into partitions of about
``maxEntriesPerPartition`` entries by an estimate of each range's size; a
range bigger than that is a partition of its own.

A streaming query with a ``pattern`` SCANs the keyspace for its streams at
its first trigger and again at most every ``patternRefreshSeconds``, not at
every trigger: a SCAN walks every key of every node. A trigger asks which
streams moved with one multi-stream XREAD of up to ten entries a stream per
thousand streams, then the newest id and length of those with more alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from pyspark.sql.datasource import InputPartition
from redis.cluster import RedisCluster

from .._redis.wire import text
from ..exceptions import ConfigurationError

__all__ = [
    "DEFAULT_PARTITION_ENTRIES",
    "DEFAULT_REFRESH_S",
    "Discovery",
    "Ranges",
    "chunks",
    "lengths",
    "moved",
    "newest",
    "node_name",
    "pack",
]

#: Entries a partition reads at most, by estimate, before the next stream starts another.
DEFAULT_PARTITION_ENTRIES = 10_000
#: Seconds between a streaming query's SCANs for new streams of its pattern.
DEFAULT_REFRESH_S = 60.0
#: Streams one pipeline asks about at once while planning.
PLAN_CHUNK = 1_000
#: New entries a trigger's look at each stream reads at most: a stream with fewer is planned from
#: them alone (its end and size); one with more is asked its newest id and length.
PEEK = 10


@dataclass(frozen=True)
class Ranges(InputPartition):
    """Streams on one node, each read after ``start`` up to ``end`` (inclusive), fixed when planned.

    Each range is ``(stream, start, end)``; ``start`` is an XRANGE bound (``-``,
    ``<id>`` or ``(<id>``) for the batch reader, the last id of the previous
    batch for the streaming one.
    """

    ranges: tuple[tuple[str, str, str], ...]


def pack(
    ranges: Iterable[tuple[str, str, str, int]],
    node: Callable[[str], str] | None,
    target: int,
) -> list[Ranges]:
    """Partitions of ``(stream, start, end, estimated entries)`` ranges: the streams of one node
    (``node(stream)``; ``None``: one node) in
    the order given, a new partition when the next range would take one past ``target`` entries
    (a range counts at least one), so a big stream is alone and small ones share."""
    by_node: dict[str, list[tuple[str, str, str, int]]] = {}
    if node is None:
        by_node[""] = list(ranges)
    else:
        for r in ranges:
            by_node.setdefault(node(r[0]), []).append(r)
    out: list[Ranges] = []
    for group in by_node.values():
        current: list[tuple[str, str, str]] = []
        size = 0
        for stream, start, end, estimate in group:
            estimate = max(1, estimate)
            if current and size + estimate > target:
                out.append(Ranges(tuple(current)))
                current, size = [], 0
            current.append((stream, start, end))
            size += estimate
        if current:
            out.append(Ranges(tuple(current)))
    return out


class Discovery:
    """The streams a read covers, the pattern's SCANned again only when ``every`` seconds have passed.

    ``every`` = 0 SCANs at every call. Named streams are always there; a
    stream the pattern finds joins at the next SCAN.
    """

    def __init__(
        self,
        scan: Callable[[Any], list[str]],
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scan = scan
        self._every = every
        self._clock = clock
        self._names: list[str] | None = None
        self._at = 0.0

    def names(self, client: Any, *, fresh: bool = False) -> list[str]:
        """The streams: SCANned again if ``fresh``, at the first call, or once ``every`` has passed."""
        now = self._clock()
        if fresh or self._names is None or now - self._at >= self._every:
            self._names = self._scan(client)
            self._at = now
        return list(self._names)


def chunks(names: list[str]) -> Iterator[list[str]]:
    """``names`` a pipeline's worth at a time."""
    for at in range(0, len(names), PLAN_CHUNK):
        yield names[at : at + PLAN_CHUNK]


def newest(
    client: Any, names: list[str], with_length: bool = True
) -> Iterator[tuple[str, str, int]]:
    """``(stream, newest id, length)`` of each stream that has an entry (no such stream, or an empty
    one, has nothing to read), pipelined; ``with_length`` False: no XLEN, the length 0."""
    per = 2 if with_length else 1
    for chunk in chunks(names):
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.xrevrange(name, "+", "-", count=1)
            if with_length:
                pipe.xlen(name)
        replies = pipe.execute()
        for k, name in enumerate(chunk):
            last = replies[per * k]
            if last:
                yield name, last[0][0].decode(), int(replies[per * k + 1]) if with_length else 0


def lengths(client: Any, names: list[str]) -> dict[str, int]:
    """Each stream's length (XLEN, pipelined)."""
    out: dict[str, int] = {}
    for chunk in chunks(names):
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.xlen(name)
        out.update((name, int(n)) for name, n in zip(chunk, pipe.execute()))
    return out


def moved(client: Any, start: Mapping[str, str]) -> dict[str, tuple[int, str]]:
    """The streams with an entry after their ``start`` id, each with how many it has there (up to
    :data:`PEEK`) and the last of those: one multi-stream ``XREAD COUNT PEEK`` per chunk of streams
    (per hash slot on a cluster), so a trigger where few streams moved costs a few commands, not
    one a stream, and a stream with fewer than ``PEEK`` new entries needs no other question. A key
    that is not a stream is named in the error."""
    out: dict[str, tuple[int, str]] = {}
    for group in _by_slot(client, list(start)):
        for chunk in chunks(group):
            try:
                reply = client.xread({name: start[name] for name in chunk}, count=PEEK)
            except redis.ResponseError as exc:
                raise _which(client, chunk, exc) from exc
            for name, entries in _streams(reply):
                if entries:
                    out[name] = (len(entries), text(entries[-1][0]))
    return out


def node_name(client: Any) -> Callable[[str], str] | None:
    """What :func:`pack` groups by: the name of the node owning a stream, on a cluster (None off one)."""
    if not isinstance(client, RedisCluster):
        return None
    return lambda stream: str(client.get_node_from_key(stream).name)  # type: ignore[no-untyped-call]


def _by_slot(client: Any, names: list[str]) -> list[list[str]]:
    """``names`` as one group, or on a cluster, a group per hash slot (a command's keys share one)."""
    if not isinstance(client, RedisCluster):
        return [names]
    slots: dict[int, list[str]] = {}
    for name in names:
        slots.setdefault(client.keyslot(name), []).append(name)  # type: ignore[no-untyped-call]
    return list(slots.values())


def _streams(reply: Any) -> list[tuple[str, Any]]:
    """``(stream, entries)`` of an XREAD reply (RESP2: pairs; RESP3: a map)."""
    pairs = reply.items() if isinstance(reply, dict) else (reply or ())
    return [(text(name), entries) for name, entries in pairs]


def _which(client: Any, chunk: list[str], exc: redis.ResponseError) -> Exception:
    """The error of a multi-stream read, naming the key that is not a stream where one is not."""
    pipe = client.pipeline(transaction=False)
    for name in chunk:
        pipe.type(name)
    for name, kind in zip(chunk, pipe.execute()):
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind not in ("stream", "none"):
            return ConfigurationError(f"{name!r} is not a stream (it holds a {kind})")
    return exc
