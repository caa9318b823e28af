"""Delayed retries and scheduled registrations: parked entries go back into the LBS when they are
due; the one caller of ``promote-4.lua``.

A failed stream (a ``run()`` handler that raised or timed out, a
``hand_back`` with a retry counted or a delay) is not re-queued at once:
``requeue-6.lua`` parks the copy it would have added to the LBS in the
stream ``{<service>-input}:delayed`` and scores its id in the sorted set
``{<service>-input}:due`` with the server time it is due, atomically with
the ack and delete of the original. Both keys live in Redis, in the LBS's
slot, so a parked retry survives restarts of every client.

Every started client runs one task that calls ``promote-4.lua``: it moves
the due copies back into the LBS as fresh entries (each copy with its
removal from the parking stream and the due index, in one script), so any
number of clients promote without duplicates, and the parked work of a
client that died comes back through the others. The task polls every
``min(1 s, retry_delay / 2)`` (at least 50 ms) while anything is parked,
sooner when the script reports the next due time, and at once when this
client parks a copy due before its next poll. When nothing is parked (nor
waiting for its name) it polls every :data:`IDLE_POLL`: a producer parks
scheduled registrations (``Producer.add_stream(..., delay=)``,
:mod:`lbs._schedule`) and a publisher delayed keyed messages (``Publisher.publish(..., delay=)``:
``promote-4.lua`` publishes them to their keys) in the same keys without telling any consumer, so the
idle poll bounds how late one is promoted: within a second of its due time
(to the millisecond when a poll already saw it parked). Each poll is the
Lua-free look of :mod:`lbs._redis.peek` (``TIME`` and two ``ZRANGE``, one
round trip): an idle consumer costs Redis three cheap reads a second.
"""

from __future__ import annotations

import asyncio
import math

from redis.exceptions import RedisError

from _lbscore import CommandBatch

from .. import _keys
from .._redis import peek, scripts
from .._redis.errors import KeyTypeError
from .._redis.wire import first_error
from .._waits import wait_set
from .activity import Activity
from .state import ClientState

__all__ = ["Delays"]

#: Most parked copies one promote-4.lua call moves (a full batch calls again at once).
PROMOTE_BATCH = 500
#: The shortest and longest wait between two polls (seconds).
MIN_POLL, MAX_POLL = 0.05, 1.0
#: The wait between two polls when nothing is parked nor waiting (seconds): the most a scheduled
#: registration parked by a producer is promoted after its due time.
IDLE_POLL = 1.0


class Delays(Activity, kind="delays"):
    """The promotion task of one client."""

    def __init__(self, state: ClientState) -> None:
        self.state = state
        service = state.names.service
        #: The parking stream and the due index.
        self.parked_key = _keys.delayed_stream(service)
        self.due_key = _keys.due_key(service)
        #: The names registrations wait for (one holder per data stream name).
        self.waiting_key = _keys.waiting_key(service)
        delay = state.config.retry_delay
        #: How long the task waits between polls when nothing is known to be due sooner.
        self.interval = min(MAX_POLL, max(MIN_POLL, delay / 2)) if delay > 0 else MAX_POLL
        self._wake = asyncio.Event()
        self._next_poll = math.inf  # loop time of the next poll (inf while a call runs)
        self._refused = ""  # the last precondition error logged (logged again only when it changes)
        self._empty = (
            False  # the last look found nothing parked nor waiting: the next sends no TIME
        )

    def soon(self, seconds: float) -> None:
        """A copy was parked for ``seconds``: poll by then if the next poll comes later."""
        at = asyncio.get_running_loop().time() + seconds
        if at < self._next_poll:
            self._next_poll = at
            self._wake.set()

    async def promote(self) -> tuple[int, float | None]:
        """One ``promote-4.lua`` call: how many copies went back, and seconds until the next is due
        (0: more are due now; None: nothing more is parked). Raises the Redis error."""
        s = self.state
        n = s.names

        def build(b: CommandBatch) -> None:
            scripts.promote(
                b,
                self.due_key,
                self.parked_key,
                n.stream_key,
                self.waiting_key,
                batch=PROMOTE_BATCH,
                group=n.group,
                key_prefix=n.key_prefix,
            )

        (out,) = first_error(await s.link.pool.execute(build, retry_safe=True))
        p = scripts.promote_reply(out)
        moved, vanished, stuck, waiters = p.moved, p.vanished, p.stuck, p.waiters
        if waiters:
            s.log.warning(
                "%d registrations waited for data streams whose holder vanished without releasing "
                "them (its entry trimmed or deleted while pending); the oldest of each is back in %s",
                waiters,
                n.stream_key,
            )
        if vanished:
            s.log.warning(
                "%d parked retries were gone from %s when due; dropped from %s",
                vanished,
                self.parked_key,
                self.due_key,
            )
        if stuck:
            s.log.error(
                "%d parked entries in %s have too many fields to move back into %s, or are "
                "malformed delayed publishes; left there (scored +inf in %s)",
                stuck,
                self.parked_key,
                n.stream_key,
                self.due_key,
            )
        if moved:
            s.log.debug("%d delayed retries are back in %s", moved, n.stream_key)
        return moved, p.next_due

    async def nothing_due(self) -> tuple[bool, float | None]:
        """A look without Lua (:mod:`lbs._redis.peek`: ``TIME`` and the earliest of the due index and
        of the waiting index; no ``TIME`` while both were empty at the last look, and a head found so
        goes to the script, which judges it) before the script: ``(True, seconds until the earliest is due, None when
        both are empty)`` when nothing is due now, so the poll costs Redis three reads and not a script
        call; ``(False, None)`` when something is, or a reply is not what it should be (a key of another
        type: the script names it)."""
        s = self.state
        timed = not self._empty  # both were empty at the last look: is anything there at all?
        try:
            replies = await s.link.pool.execute(
                lambda b: peek.peek(b, [self.due_key, self.waiting_key], with_time=timed),
                retry_safe=True,
            )
            due = peek.peek_reply(replies, zsets=2, with_time=timed).due_in()
        except (RedisError, ValueError, TypeError):
            self._empty = False
            return False, None
        self._empty = due is None
        return (False, None) if due == 0 else (True, due)

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.state
        while not s.stopping.is_set():
            wait = self.interval
            self._next_poll = math.inf  # a copy parked while the call runs may be after its look
            try:
                quiet, next_due = await self.nothing_due()
                if not quiet:
                    _, next_due = await self.promote()
                self._refused = ""
                if next_due is None:
                    wait = max(wait, IDLE_POLL)  # nothing parked: see the module's docstring
                else:
                    # A millisecond late rather than early: the server's clock decides what is due.
                    wait = min(wait, next_due + 0.001 if next_due else 0.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = str(exc)
                if isinstance(exc, KeyTypeError):
                    if message != self._refused:
                        s.hooks.metric("wrong_type_keys_total", 1)
                        s.log.error(
                            "cannot bring delayed retries back: %s; they stay parked",
                            message.removeprefix("LBSKEY "),
                        )
                    self._refused = message
                elif not s.denied(exc, "bringing delayed retries back"):
                    s.log.debug("promoting delayed retries failed: %s", exc)
            self._next_poll = min(self._next_poll, loop.time() + wait)
            while (left := self._next_poll - loop.time()) > 0:
                self._wake.clear()
                if not await wait_set(self._wake, left):
                    break
