"""Registering data streams in the load-balancer stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Union

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from _lbscore import CommandBatch
from _lbscore import encode_input as _core_encode

from . import _keys, _schedule
from ._keys import shard_of
from ._redis.connection import redirected
from ._redis.routes import Sender
from ._redis.wire import Wire
from .exceptions import BatchError, InvalidInputError, RedisOperationError

__all__ = ["Producer", "StreamSpec", "encode_input"]

#: One data stream to register: its name, or ``(name, info)``.
StreamSpec = Union[str, "tuple[str, Mapping[str, Any] | None]"]

_FIELD = _keys.INPUT_FIELD.encode()


class Producer(Sender):
    """Registers data streams in the LBS ``<service>-input`` for consumers to pick up.

    Each registration is one LBS entry whose field ``lbs-input`` holds
    ``{"DataStreamName": name, "Info": info}``, the Go client's wire format.
    ``redis`` is a ``redis.asyncio.Redis`` client (left open by :meth:`close`)
    or a URL (lbs opens the client and closes it). A batch is encoded by the
    compiled core and sent in one write on a connection of the client's pool,
    which :meth:`close` gives back.

    Nothing a consumer would dead-letter is sent: every value is judged by
    the consumers' own entry parser (the one :class:`lbs.Client` reads with)
    before anything goes out, with ``max_input_bytes`` as the size limit
    (keep it at or below the consumers' ``Config.max_input_bytes``; both
    default to 65,536), and refused with :class:`lbs.InvalidInputError`.

    Plugins (``plugins=``, and the installed ones unless ``load_entrypoint_plugins=False``, as for
    :class:`lbs.Client`) may add fields to every entry beside ``lbs-input`` (hook
    ``lbs_message_fields``, asked once per call: ``lbs-otel`` adds the W3C trace context); with
    none, an entry holds ``lbs-input`` only.
    """

    def _stream_for(self, name: str) -> str:
        return self.streams[shard_of(name, self.shards)] if self.shards > 1 else self.stream

    def _check(self, payloads: list[bytes], names: list[str], single: bool) -> None:
        """Refuse what a consumer would dead-letter, judged by the consumers' own parser."""
        entries = self._judge.parse_entries([[b"", [_FIELD, p]] for p in payloads])
        for k, e in enumerate(entries):
            if e.error is not None:
                where = "" if single else f"add_streams: entry {k}: "
                raise InvalidInputError(
                    f"{where}data stream {names[k]!r:.100}: {e.error}; "
                    "a consumer would dead-letter it"
                )

    async def add_stream(
        self,
        name: str,
        info: Mapping[str, Any] | None = None,
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> str:
        """Register data stream ``name``; return the LBS entry id.

        ``delay`` (seconds, or a :class:`~datetime.timedelta`) or ``at`` (a
        :class:`~datetime.datetime` with a time zone) schedule it: the entry
        is parked in ``{<service>-input}:delayed`` as a failed stream's retry
        is, due at the Redis server's time plus ``delay`` (or at ``at``), and
        any running consumer moves it into the LBS within a second of that
        (docs/producing.md, "Scheduled registrations"); the id returned is
        then its parked id. A delay of 0, or an ``at`` already past, registers
        it now.

        Raises :class:`lbs.InvalidInputError`, before sending anything, if
        ``name`` is not a non-empty str, ``info`` is not a mapping (or None),
        either cannot be encoded (JSON, UTF-8: a lone surrogate), or the value
        is bigger than ``max_input_bytes``: whatever a consumer would
        dead-letter; :class:`lbs.ConfigurationError` for both ``delay`` and
        ``at``, a negative delay, a naive ``at``. :class:`lbs.RedisOperationError` if Redis fails.
        """
        due = _schedule.due_ms(delay, at)
        payload = _encode(name, info, "")
        self._check([payload], [name], single=True)
        if due is not None:
            (parked_id,) = await self._park(self._shard_of(name), [payload], due, "add_stream")
            return parked_id
        fields: dict[Any, Any] = {_keys.INPUT_FIELD: payload}
        extra = self._message_fields()
        if extra:
            fields.update(zip(extra[::2], extra[1::2]))
        try:
            entry_id = await self._redis.xadd(self._stream_for(name), fields)
        except (RedisError, RedisClusterException) as exc:
            raise RedisOperationError("add_stream", exc) from exc
        return _as_str(entry_id)

    def _shard_of(self, name: str) -> str:
        """The service (its shard's) whose keys a registration of ``name`` goes to."""
        return self.services[shard_of(name, self.shards)] if self.shards > 1 else self.service

    async def _park(
        self, service: str, payloads: list[bytes], due: tuple[bool, int], operation: str
    ) -> list[str]:
        """Park ``payloads`` due at ``due`` in ``service``'s parking stream (:mod:`lbs._schedule`);
        their parked ids. A redirect (the slot moved) or a demoted master ran nothing: sent once more."""
        extra = [x.encode() for x in self._message_fields()]
        return await self._park_entries(
            service, [[_FIELD, p, *extra] for p in payloads], due, operation
        )

    async def add_streams(
        self,
        streams: Iterable[StreamSpec],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> list[str]:
        """Register many data streams in one round trip; return their entry ids in order.

        ``delay`` or ``at`` schedule every one of them, as for :meth:`add_stream` (their parked ids
        are returned): each shard's are parked in one transaction (two round trips); a shard that
        failed raises :class:`lbs.BatchError` as below.

        Every value is encoded and judged before anything is sent, so a bad
        one (see :meth:`add_stream`) raises :class:`lbs.InvalidInputError`
        naming its position, and registers nothing.

        The entries of each LBS (one per shard) go in one MULTI/EXEC
        transaction, so each shard's part is registered whole or not at
        all, except for a command that fails as it runs (a key of the wrong
        type), which fails alone. When any entry was not registered,
        :class:`lbs.BatchError` (a :class:`lbs.RedisOperationError`) says
        which were: ``entry_ids`` holds the id of each registered entry and
        ``None`` for the others, in input order, and ``unknown`` the
        positions whose connection failed after the batch was sent (they may
        or may not be registered: XADD is not idempotent, so resending them
        can register them twice). On a cluster, a shard's transaction that a
        node refused with a redirect (the slot moved) ran nowhere, and is
        sent once more to the slot's new owner.
        """
        due = _schedule.due_ms(delay, at)
        if isinstance(streams, (str, bytes)):
            raise InvalidInputError(
                f"add_streams takes an iterable of names or (name, info) pairs, not one {type(streams).__name__}"
            )
        try:
            specs = iter(streams)
        except TypeError:
            raise InvalidInputError(
                f"add_streams takes an iterable of names or (name, info) pairs, got {type(streams).__name__}"
            ) from None
        names: list[str] = []
        payloads: list[bytes] = []
        name: Any
        info: Any
        for k, spec in enumerate(specs):
            if type(spec) is str:
                name, info = spec, None
            elif type(spec) is tuple and len(spec) == 2:
                name, info = spec
            else:
                name, info = _unpack(spec, k)
            try:
                payloads.append(
                    _core_encode(
                        name,
                        info
                        if info is None or type(info) is dict
                        else _as_info(info, f"add_streams: entry {k}: "),
                    )
                )
            except (InvalidInputError, UnicodeEncodeError, RecursionError):
                _encode(name, info, f"add_streams: entry {k}: ")  # raises, with the reason
                raise
            names.append(name)
        if not payloads:
            return []
        self._check(payloads, names, single=False)
        if due is not None:
            return await self._park_many(names, payloads, due)
        # The positions of each shard's LBS, in input order: one transaction each.
        shards: dict[str, list[int]] = {}
        if self.shards == 1:
            shards[self.stream] = list(range(len(payloads)))
        else:
            for k, name in enumerate(names):
                shards.setdefault(self._stream_for(name), []).append(k)
        ids: list[str | None] = [None] * len(payloads)
        extra = self._message_fields()
        unknown: list[int] = []
        failures: list[tuple[int, BaseException]] = []  # (first position it hit, cause)
        cluster = isinstance(self._redis, RedisCluster)
        stale = await self._send_shards(
            shards, payloads, ids, unknown, failures, retry_redirects=True, extra=extra
        )
        if stale:
            # A transaction refused with a redirect met a node that no longer owns
            # its slot and ran nowhere: find the owners again, send it once more. Off a
            # cluster: READONLY, a master demoted by a failover (the wire reconnects; a
            # Sentinel's pool to the new master).
            try:
                if cluster:
                    await self._routes.forget()
            except (RedisError, RedisClusterException) as exc:
                failures.append((min(ks[0] for ks in stale.values()), exc))
            else:
                await self._send_shards(
                    stale, payloads, ids, unknown, failures, retry_redirects=False, extra=extra
                )
        if failures:
            cause = min(failures, key=lambda f: f[0])[1]
            raise BatchError("add_streams", cause, ids, sorted(unknown)) from cause
        return ids  # type: ignore[return-value]  # no failure: every one is an id

    async def _park_many(
        self, names: list[str], payloads: list[bytes], due: tuple[bool, int]
    ) -> list[str]:
        """``add_streams`` scheduled: each shard's part parked in one transaction (:meth:`_park`)."""
        shards: dict[str, list[int]] = {}
        for k, name in enumerate(names):
            shards.setdefault(self._shard_of(name), []).append(k)
        results = await asyncio.gather(
            *(
                self._park(svc, [payloads[k] for k in ks], due, "add_streams")
                for svc, ks in shards.items()
            ),
            return_exceptions=True,
        )
        ids: list[str | None] = [None] * len(payloads)
        failures: list[tuple[int, BaseException]] = []
        unknown: list[int] = []
        for ks, result in zip(shards.values(), results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                cause = result.cause if isinstance(result, RedisOperationError) else result
                if isinstance(cause, (ConnectionError, OSError, RedisConnectionError)):
                    unknown.extend(ks)
                failures.append((ks[0], cause))
                continue
            for k, entry_id in zip(ks, result):
                ids[k] = entry_id
        if failures:
            cause = min(failures, key=lambda f: f[0])[1]
            raise BatchError("add_streams", cause, ids, sorted(unknown)) from cause
        return ids  # type: ignore[return-value]  # no failure: every one is an id

    async def _send_shards(
        self,
        shards: dict[str, list[int]],
        payloads: list[bytes],
        ids: list[str | None],
        unknown: list[int],
        failures: list[tuple[int, BaseException]],
        retry_redirects: bool,
        extra: list[str],
    ) -> dict[str, list[int]]:
        """Send each shard's transaction (one batch per connection), filling ``ids``, ``unknown``
        and ``failures``; return the shards refused with a redirect when ``retry_redirects``.
        ``extra``: the plugins' fields for every entry, flat."""
        groups: dict[str, tuple[Wire, list[str]]] = {}
        for stream, ks in shards.items():
            try:
                node, wire = await self._routes.wire_for(stream)
            except Exception as exc:  # the slot map could not be read: this shard is not sent
                failures.append((ks[0], exc))
                continue
            groups.setdefault(node, (wire, []))[1].append(stream)
        results = await asyncio.gather(
            *(
                self._send(wire, [(s, shards[s]) for s in streams], payloads, extra)
                for wire, streams in groups.values()
            ),
            return_exceptions=True,
        )
        stale: dict[str, list[int]] = {}
        for (_, streams), replies in zip(groups.values(), results):
            if isinstance(replies, BaseException):
                if not isinstance(replies, Exception):
                    raise replies  # cancelled: the Wire dropped its connection
                # The connection failed with the batch sent, or not: unknown.
                for s in streams:
                    unknown.extend(shards[s])
                failures.append((min(shards[s][0] for s in streams), replies))
                continue
            at = 0
            for s in streams:
                ks = shards[s]
                shard_ids, error = _transaction_outcome(replies[at : at + len(ks) + 2], len(ks))
                at += len(ks) + 2
                for k, entry_id in zip(ks, shard_ids):
                    ids[k] = entry_id
                if error is None:
                    continue
                if retry_redirects and redirected(error) and all(i is None for i in shard_ids):
                    stale[s] = ks
                else:
                    failures.append((next(k for k, i in zip(ks, shard_ids) if i is None), error))
        return stale

    @staticmethod
    async def _send(
        wire: Wire, shards: list[tuple[str, list[int]]], payloads: list[bytes], extra: list[str]
    ) -> list[Any]:
        def build(b: CommandBatch) -> None:
            for stream, ks in shards:
                key = stream.encode()
                b.command("MULTI")
                if extra:
                    for k in ks:
                        b.command("XADD", key, "*", _FIELD, payloads[k], *extra)
                else:
                    for k in ks:
                        b.command("XADD", key, "*", _FIELD, payloads[k])
                b.command("EXEC")

        return await wire.execute(build)

    async def __aenter__(self) -> Producer:
        return self


def _unpack(spec: object, k: int) -> tuple[object, object]:
    """``(name, info)`` of an ``add_streams`` item that is not a plain str or 2-tuple."""
    if isinstance(spec, str):
        return spec, None
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return spec[0], spec[1]
    raise InvalidInputError(
        f"add_streams: entry {k}: expected a name or a (name, info) pair, got {spec!r:.100}"
    )


def encode_input(name: str, info: Mapping[str, Any] | None = None) -> bytes:
    """The ``lbs-input`` value registering data stream ``name``: ``{"DataStreamName": name, "Info": info}``.

    Compact JSON, as the Go client writes it (the compiled core encodes it).
    Raises :class:`lbs.InvalidInputError` for what no consumer could read
    back: a name that is not a non-empty str, an Info that is not a mapping
    of JSON values, a lone surrogate anywhere, nesting too deep.
    """
    return _encode(name, info, "")


def _encode(name: object, info: object, where: str) -> bytes:
    """The ``lbs-input`` value of one registration, or InvalidInputError (``where`` prefixes it)."""
    if not isinstance(name, str):
        raise InvalidInputError(f"{where}data stream name must be a str, got {type(name).__name__}")
    if info is not None and type(info) is not dict:
        info = _as_info(info, where)
    try:
        return _core_encode(name, info)
    except UnicodeEncodeError as exc:
        raise InvalidInputError(where + _unencodable(name, exc)) from None
    except InvalidInputError as exc:
        if not where:
            raise
        raise InvalidInputError(f"{where}{exc}") from exc


def _as_info(info: object, where: str) -> dict[str, Any]:
    """An Info that is not a dict, as one; InvalidInputError when it is not a mapping."""
    if not isinstance(info, Mapping):
        raise InvalidInputError(f"{where}info must be a mapping or None, got {type(info).__name__}")
    return dict(info)


def _transaction_outcome(replies: list[Any], n: int) -> tuple[list[str | None], Exception | None]:
    """One shard's ``MULTI``, ``n`` XADDs and ``EXEC``: each entry's id (None where it failed) and
    the first error."""
    multi, queued, done = replies[0], replies[1 : n + 1], replies[n + 1]
    if isinstance(multi, Exception):
        results = queued  # no transaction (MULTI refused, e.g. by an ACL): each XADD ran alone
    elif isinstance(done, list) and len(done) == n:
        results = done
    else:
        # EXECABORT: a command was refused as it was queued (out of memory, a
        # redirect, ...), and none of them ran.
        error = next((q for q in queued if isinstance(q, Exception)), None)
        if error is None:
            error = (
                done if isinstance(done, Exception) else ResponseError(f"EXEC returned {done!r}")
            )
        return [None] * n, error
    out: list[str | None] = []
    first: Exception | None = None
    for reply in results:
        if isinstance(reply, Exception):
            out.append(None)
            first = first or reply
        else:
            out.append(_as_str(reply))
    return out, first


def _unencodable(name: str, exc: UnicodeEncodeError) -> str:
    """Which part of a registration UTF-8 cannot encode (a lone surrogate), for InvalidInputError."""
    try:
        name.encode()
    except UnicodeEncodeError as bad:
        return (
            f"data stream name {name!r:.100} contains {bad.object[bad.start : bad.end]!r} at position "
            f"{bad.start}, which UTF-8 cannot encode ({bad.reason}: a lone surrogate)"
        )
    around = exc.object[max(0, exc.start - 30) : exc.end + 30]
    return (
        f"info of data stream {name!r:.100} contains {exc.object[exc.start : exc.end]!r}, which UTF-8 "
        f"cannot encode ({exc.reason}: a lone surrogate), in {around!r}"
    )


def _as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
