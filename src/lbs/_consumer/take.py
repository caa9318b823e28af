"""The take: what a read delivered becomes this consumer's, with plain commands (:mod:`lbs._redis.reads`).

An ``XREADGROUP`` leaves its entries pending to this consumer. One ``MULTI`` then checks that the
lease holds this process's value, takes the batch's fencing token and its data stream names
(``MSETNX``); only a batch whose names could not all be taken at once goes to ``names-1.lua``
(entries that wait for their name, or whose name key is of another type). The result is a token per
entry, as :class:`~lbs._consumer.intake.Intake` reads them: the batch's token (an int) for an entry
held, ``WAIT <holder id>`` or ``WRONGTYPE <type> <key>`` for one that is not.

A take under a lease that is not this process's (it lapsed, and the heartbeat takes it back; or
another process runs under the same consumer id) holds nothing: its entries are *stranded*, pending
to this consumer and held by nobody, and go back (no retry counted) once the lease is this
process's again: :meth:`Taker.put_back_stranded`. So does a batch taken while the service is paused
(the ``MULTI`` reads its pause key, :func:`lbs._keys.paused_key`): nothing of it starts, and
:attr:`Taker.paused` tells the reader to wait for the resume. Each batch's token is
recorded in the consumer's tokens hash for ``lbs status`` (``HSET``, sent with the next read:
:meth:`Taker.record`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from _lbscore import CommandBatch, Entry

from .._redis import reads
from .._redis.errors import LeaseLostError
from .._redis.wire import first_error, text
from .requeue import Requeue
from .state import ClientState

__all__ = ["Taker"]

#: How long fair dispatch trusts a look that found no idle peer (seconds): a drain by busy
#: consumers looks once per this long, not once per read.
NO_PEER_FOR = 0.1


def _fields(raw: Any) -> dict[str, Any]:
    """An XINFO record (a RESP2 flat list or a RESP3 map) as a dict with text keys."""
    if isinstance(raw, dict):
        return {text(k, "replace"): v for k, v in raw.items()}
    return {text(k, "replace"): v for k, v in zip(raw[::2], raw[1::2])}


class Taker:
    """Takes the batches one client's reader reads: the lease, the token, the names."""

    def __init__(self, state: ClientState, requeue: Requeue) -> None:
        self.state, self.requeue = state, requeue
        self._floored = -1  # the read wire's connection count when it last floored the counter
        self._msetnx = True  # False once the ACL refused MSETNX: names one by one
        self._record: tuple[str, str] | None = (
            None  # a batch's token record, sent with the next read
        )
        self._record_failed = False
        self._no_peer_until = -math.inf
        #: Entries read under a lease that was not ours, or while the service was paused: put back
        #: (once the lease is ours).
        self.stranded: list[str] = []
        #: The last take found the service paused (its batch was stranded); the reader clears it.
        self.paused = False

    # -- the token record ------------------------------------------------------------------

    def record(self, b: CommandBatch) -> bool:
        """Write the last batch's token record into ``b`` (before the next read); whether it did."""
        if self._record is None:
            return False
        field, value = self._record
        self._record = None
        b.command("HSET", self.state.names.tokens_key, field, value)
        return True

    def recorded(self, reply: Any) -> None:
        """The reply of a :meth:`record`: a failure is logged once (``lbs status`` then shows no
        token for that batch; nothing else depends on it)."""
        if isinstance(reply, Exception) and not self._record_failed:
            self._record_failed = True
            self.state.log.warning(
                "keeping a read's token record in %s failed (%s); `lbs status` shows no token for it",
                self.state.names.tokens_key,
                reply,
            )

    async def flush_record(self) -> None:
        """Send a pending token record on its own (the reader waits instead of reading next)."""
        if self._record is None:
            return
        try:

            def build(b: CommandBatch) -> None:
                self.record(b)

            (reply,) = await self.state.link.read.execute(build)
            self.recorded(reply)
        except (RedisError, OSError) as exc:
            self.recorded(exc)

    # -- fair dispatch -----------------------------------------------------------------------

    async def share(self, count: int) -> int:
        """Fair dispatch: how many of ``count`` this consumer takes now. The live consumers (this one
        and every peer that read within ``Config.fair_window``) split what waits and what they hold
        evenly: this one's share is ``ceil((waiting + held by them) / live) - held by it`` (its peers'
        holdings as Redis counts them, pending; its own as it counts them, its busy slots). ``count``
        when nothing waits or the share is no limit (then not looked at again for
        :data:`NO_PEER_FOR`). Two XINFO replies in one round trip."""
        s = self.state
        n = s.names
        if time.monotonic() < self._no_peer_until:
            return count

        def build(b: CommandBatch) -> None:
            b.command("XINFO", "GROUPS", n.stream_key)
            b.command("XINFO", "CONSUMERS", n.stream_key, n.group)

        groups, consumers = await s.link.read.execute(build, retry_safe=True)
        if isinstance(groups, Exception) or isinstance(consumers, Exception):
            return count  # no stream or group yet: the read says so
        lag = None
        for g in groups:
            f = _fields(g)
            if text(f.get("name", b""), "replace") == n.group:
                lag = f.get("lag")
        if lag == 0 or lag is None:  # nothing waits, or Redis cannot tell: a full read
            return count
        window = s.config.fair_window_ms or 0
        # What this consumer holds, as it knows it: its pending count in Redis still includes the
        # streams whose handler returned and whose done is not sent yet (a slot already free here),
        # and a share judged by it waits for a slot that freed before the look.
        mine = len(s.handlers) if s.run_limit else len(s.holdings)
        live, held = 1, 0
        for c in consumers:
            f = _fields(c)
            if text(f.get("name", b""), "replace") == n.id:
                continue
            idle = f.get("idle")
            if idle is not None and int(idle) < window:  # it reads: alive (0: it just read)
                live += 1
                held += int(f.get("pending") or 0)
        share = max(0, math.ceil((int(lag) + held + mine) / live) - mine)
        if share >= count:
            self._no_peer_until = time.monotonic() + NO_PEER_FOR
            return count
        return share

    # -- the take ------------------------------------------------------------------------------

    async def take(self, entries: Sequence[Entry], queues: bool) -> list[Any]:
        """Make a read batch ours (see the module); one token per entry. Raises ``LeaseLostError``
        when the lease is not this process's (the entries are stranded); ``[]`` when the service
        was paused (stranded too, :attr:`paused` set)."""
        s = self.state
        n = s.names
        wire = s.link.read
        ids = [e.id for e in entries]
        named = [(e.stream, e.id) for e in entries if e.error is None and e.stream]
        distinct = len({name for name, _ in named}) == len(named)
        prefix = f"{n.key_prefix}name:"
        at_once = [(prefix + name, i) for name, i in named] if distinct and self._msetnx else []
        queued = n.queued_key if queues else ""
        lease = s.lease.value
        floor = wire.connects != self._floored

        paused_key = n.paused_key

        def build(b: CommandBatch) -> None:
            reads.take(b, n.fence_key, n.lease_key, at_once, queued, ids, floor, paused_key)

        try:
            took = reads.take_reply(await wire.execute(build), floor, bool(at_once), True)
        except NoPermissionError as exc:
            if not at_once or "msetnx" not in str(exc).lower():
                self.stranded += ids
                raise
            self._msetnx = False  # the ACL has no +msetnx: names one by one from now on
            s.log.info("the ACL refuses MSETNX (%s); data stream names are taken one by one", exc)
            at_once = []
            took = reads.take_reply(await wire.execute(build), floor, False, True)
        except ResponseError:
            self.stranded += ids  # the transaction was refused whole: nothing of it ran
            raise
        if floor and took.error is None:
            self._floored = wire.connects
        held = took.lease
        if isinstance(held, bytes):
            held = held.decode("utf-8", "replace")
        if held != lease:
            self.stranded += ids
            raise LeaseLostError(f"LEASE {held or ''}".rstrip())
        if took.paused:
            # Paused while this batch was read: nothing of it starts. Its names (taken by this
            # MULTI) are released when the entries go back (put_back_stranded, no retry counted).
            self.paused = True
            self.stranded += ids
            return []
        token = took.token
        if (
            isinstance(token, Exception)
            or not reads.TOKEN_FLOOR <= token < reads.TOKEN_CEILING
            or (floor and took.error is not None)
        ):
            # The counter was lost, is of another type or past 2^53, or the floor failed: fence-1.lua
            # floors it, or says what is wrong with it ("LBSKEY <key> ...").
            try:
                token = await self._floor_and_take()
            except ResponseError:
                self.stranded += ids
                raise
        tokens: list[Any] = [token] * len(entries)
        if named and not (at_once and took.names):
            try:
                await self._names_one_by_one(entries, named, tokens, queued)
            except ResponseError:
                self.stranded += ids
                raise
        first, last = ids[0], ids[-1]
        self._record = (str(token), f"{lease}|{first}..{last}")
        return tokens

    async def _floor_and_take(self) -> int:
        """The counter was lost (or the floor failed): floor it at the server's clock, take a token."""
        s = self.state
        n = s.names
        wire = s.link.read
        (floored,) = first_error(await wire.execute(lambda b: reads.floor(b, n.fence_key)))
        self._floored = wire.connects
        (token,) = first_error(await wire.execute(lambda b: b.command("INCRBY", n.fence_key, 1)))
        s.log.warning(
            "the fencing counter %s was floored at %s (lost, or behind)", n.fence_key, floored
        )
        return int(token)

    async def names_of(self, entries: Sequence[Entry], tokens: list[Any]) -> None:
        """Take the names of the entries a re-read gave an int token (``names-1.lua``): an entry whose
        name another entry holds waits (its token becomes ``WAIT <holder id>``)."""
        named = [
            (e.stream, e.id)
            for e, t in zip(entries, tokens)
            if isinstance(t, int) and e.error is None and e.stream
        ]
        if named:
            await self._names_one_by_one(entries, named, tokens, "")

    async def _names_one_by_one(
        self, entries: Sequence[Entry], named: list[tuple[str, str]], tokens: list[Any], queued: str
    ) -> None:
        """``names-1.lua`` for a batch whose names MSETNX could not take at once."""
        s = self.state
        n = s.names
        (reply,) = first_error(
            await s.link.read.execute(
                lambda b: reads.names(b, n.stream_key, n.group, n.key_prefix, named)
            )
        )
        outcome = {entry_id: text(r, "replace") for (_, entry_id), r in zip(named, reply)}
        waiting = []
        for i, e in enumerate(entries):
            got = outcome.get(e.id, "")
            if got:
                tokens[i] = got
                if got.startswith("WAIT "):
                    waiting.append(e.id)
        if queued and waiting:
            # Acked and parked: no longer merely held by this consumer.
            try:
                await s.link.redis.srem(queued, *waiting)
            except (RedisError, OSError) as exc:
                s.log.debug("SREM of parked entries from %s failed: %s", queued, exc)

    async def put_back_stranded(
        self, reason: str = "read under a lease not this process's"
    ) -> None:
        """Put back what a refused take left pending to this consumer, held by nobody (no retry counted),
        once the lease holds this process's value again (requeue-6.lua's mode "owned"). Under a lease of
        another process (a duplicate consumer id) they are left to that process's look for strays;
        a failure leaves them to ours."""
        ids, self.stranded = self.stranded, []
        if not ids:
            return
        try:
            await self.requeue.send([(i, reason) for i in ids], mode="owned", count_retry=False)
        except (RedisError, OSError) as exc:
            self.state.log.warning(
                "putting back %d entries (%s) failed (%s); the heartbeat's look for strays will",
                len(ids),
                reason,
                exc,
            )
