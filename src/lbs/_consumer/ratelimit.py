"""The service's rate limit (``Config.rate_limit``): how many assignments the whole fleet takes a second.

Time is cut into fixed windows of ``Config.rate_limit_window`` on the *server's* clock: window ``k``
runs from ``k x window`` ms on. Window ``k`` gives :func:`allowance` assignments (``rate x window``,
rounded so that windows ``0..k`` together give ``floor((k + 1) x rate x window)``: 0.5 a second over
one-second windows gives one every other window). Its count is the hash
``{<service>-input}:rate:<k>`` (the LBS's hash tag: one slot on a cluster), written by every
consumer of the service before its read of new entries, in one ``MULTI`` on the reader's own wire
(:meth:`RateLimiter.grant`): ``HINCRBY taken <asked>``, ``HSETNX <consumer id>`` and ``HLEN`` (who
asks in this window) and ``HLEN`` of the previous window's hash (who asked in it), ``PEXPIRE`` (two
windows and a second) and ``TIME``. What fits under the window's allowance is granted
(:func:`granted`) and the ``XREADGROUP`` asks for that many; a read that got fewer gives the rest
back with its next ask in the same window (the ``HINCRBY`` of the next ask is smaller by that much).
An ask that found the window full stays counted (the window has nothing more to give anyway).

Fairness: in the first half of a window a consumer asks at most its slice, ``ceil(allowance /
askers)`` (the askers of this window or the last, whichever are more: :func:`fair_slice`); in the
second half it asks for what it can take, so slices that nobody wanted are not lost. A consumer
that got nothing waits for the next window (or the second half), woken at once by
``state.stopping``; a blocking read ends with its window (its grant is used within it).

The window number comes from :class:`lbs._redis.clock.ServerClock`, pinned by each ask's ``TIME``:
an ask whose ``TIME`` falls in another window than the one it counted in is void (nothing is read,
the next ask is dated by the corrected clock). Failures: a connection error or a refused
transaction raises (the reader's back-off); a key of another type is logged once and the window is
taken as full (the next window's key is a new one).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

from _lbscore import CommandBatch

from .. import _keys
from .._redis.clock import ServerClock
from .._redis.wire import exec_replies
from .._waits import wait_set
from .state import ClientState

__all__ = [
    "RateLimiter",
    "Windows",
    "allowance",
    "fair_slice",
    "granted",
]

#: The field of a window's hash that counts what was granted in it (consumer ids have another form).
TAKEN = "taken"
#: What a blocking read (the group was drained: a trickle) asks for: a wake-up brings one or two.
BLOCKING_ASK = 2
#: Longest pause before the first ask of a window (s), drawn uniformly: the fleet does not ask in step.
JITTER = 0.005
#: A metric for each wait of the reader for the next window (or its second half).
WAIT_METRIC = "rate_limit_waits_total"


@dataclass(frozen=True, slots=True)
class Windows:
    """The rate limit's arithmetic: ``rate`` assignments a second over windows of ``window_ms``."""

    #: The window, ms (>= 10).
    window_ms: int
    #: What one window gives, in millionths of an assignment (rate x window; exact integers).
    micro: int

    @classmethod
    def of(cls, rate: float, window: float) -> Windows:
        window_ms = max(1, round(window * 1000))
        return cls(window_ms, max(1, round(rate * window_ms * 1000)))

    def number(self, server_ms: float) -> int:
        """The window a server time (ms) falls in."""
        return int(server_ms // self.window_ms)

    def allowance(self, k: int) -> int:
        """What window ``k`` gives (see :func:`allowance`)."""
        return allowance(k, self.micro)

    def burst(self) -> int:
        """The most one window gives."""
        return -(-self.micro // 1_000_000)

    def left_ms(self, server_ms: float) -> float:
        """Until the window of ``server_ms`` ends (ms)."""
        return (self.number(server_ms) + 1) * self.window_ms - server_ms

    def ttl_ms(self) -> int:
        """A window's hash lives two windows and a second past its last ask (the next window's asks read it)."""
        return 2 * self.window_ms + 1000


def allowance(k: int, micro: int) -> int:
    """What window ``k`` gives when each gives ``micro`` millionths of an assignment: windows
    ``0..k`` give ``floor((k + 1) x micro / 10^6)`` together, so a fractional allowance is spread
    exactly (0.25 gives one every fourth window)."""
    return ((k + 1) * micro) // 1_000_000 - (k * micro) // 1_000_000


def granted(after: int, asked: int, allow: int) -> int:
    """What an ask of ``asked`` is granted, given the window's count ``after`` it (``HINCRBY``'s
    reply, the ask and any give-back included): what still fit under ``allow`` before it."""
    return max(0, min(asked, allow - (after - asked)))


def fair_slice(allow: int, askers: int) -> int:
    """A consumer's slice of a window's allowance when ``askers`` consumers ask (at least 1)."""
    return max(1, -(-allow // max(1, askers)))


class RateLimiter:
    """One reader's side of the service's rate limit (see the module): ask, read, give back."""

    def __init__(self, state: ClientState) -> None:
        self.state = state
        cfg = state.config
        assert cfg.rate_limit is not None
        self.windows = Windows.of(cfg.rate_limit, cfg.rate_limit_window)
        self.prefix = _keys.rate_prefix(state.names.service)
        self.clock = ServerClock()
        self._window = -1  # the window of the last grant
        self._mine = 0  # granted to this consumer in it, net of what went back
        self._back = 0  # granted in it, not read: goes back with the next ask in it
        self._out = 0  # the last grant, until got() says what the read used of it
        self._askers = 1  # consumers that asked in the last window seen (or this one)
        self._rtt = 0.001  # the last ask's round trip (s): how near a window's end not to ask
        self._warned = False

    def now_ms(self) -> float:
        """The server's time (ms), as this client reckons it (its own clock before the first ask)."""
        now = self.clock.now_ms(time.monotonic())
        return time.time() * 1000 if now is None else now

    def ask_for(self, count: int, k: int, at_ms: float, blocking: bool) -> int:
        """How many to ask window ``k`` for, at server time ``at_ms``: ``count`` (a blocking read's
        :data:`BLOCKING_ASK`) within this consumer's slice in the first half, what fits in the second."""
        w = self.windows
        ask = min(count, BLOCKING_ASK) if blocking else count
        first_half = at_ms - k * w.window_ms < w.window_ms / 2
        if first_half:
            mine = self._mine if k == self._window else 0
            ask = min(ask, fair_slice(w.allowance(k), self._askers) - mine)
        return max(0, ask)

    async def grant(self, count: int, wait_ms: int) -> tuple[int, int]:
        """How many of ``count`` the next read may take, and how long it may block in Redis (ms: at
        most until its window ends). ``(0, 0)``: nothing now; it waited (for the next window, its
        second half, or the shutdown) unless the clock needed correcting."""
        s = self.state
        w = self.windows
        if self._out:
            self.got(self._out)  # the last read failed: take its grant as used
        now = self.now_ms()
        left = w.left_ms(now)
        if left < self._rtt * 1000:  # the window ends before the ask would reach Redis
            await self._wait((left + JITTER * 1000 * random.random()) / 1000)
            return 0, 0
        k = w.number(now)
        ask = self.ask_for(count, k, now, wait_ms > 0)
        if ask <= 0:  # this consumer's slice is taken: wait for the window's second half
            await self._wait((k * w.window_ms + w.window_ms / 2 - now) / 1000)
            return 0, 0
        back = self._back if k == self._window else 0
        key = f"{self.prefix}{k}"

        def build(b: CommandBatch) -> None:
            b.command("MULTI")
            b.command("HINCRBY", key, TAKEN, ask - back)
            b.command("HSETNX", key, s.names.id, 1)
            b.command("HLEN", key)
            b.command("HLEN", f"{self.prefix}{k - 1}")
            b.command("PEXPIRE", key, w.ttl_ms())
            b.command("TIME")
            b.command("EXEC")

        sent = time.monotonic()
        replies = exec_replies(await s.link.read.execute(build))
        received = time.monotonic()
        self._rtt = min(received - sent, w.window_ms / 4000)
        after, _, askers, before, _, server_time = replies
        self.clock.note(server_time, sent, received)
        if k != self._window:
            self._window, self._mine, self._back = k, 0, 0
        else:
            self._mine -= back
            self._back = 0
        self._askers = max(1, _count(askers) - 1, _count(before) - 1)
        if isinstance(after, Exception):
            self._wrong(key, after)
            await self._wait(w.left_ms(self.now_ms()) / 1000)
            return 0, 0
        got = granted(int(after), ask, w.allowance(k))
        at = self.clock.now_ms((sent + received) / 2)  # when TIME ran, as the server tells it
        if at is not None and w.number(at) != k:
            # Counted in a window that was not the server's: void (what it counted stays, unread).
            self._mine += got
            return 0, 0
        if got <= 0:
            await self._wait((w.left_ms(self.now_ms()) + JITTER * 1000 * random.random()) / 1000)
            return 0, 0
        self._mine += got
        self._out = got
        block = min(wait_ms, max(1, math.ceil(w.left_ms(self.now_ms())))) if wait_ms else 0
        return got, block

    def got(self, n: int) -> None:
        """The read of the last grant took ``n``: the rest goes back with the next ask in its window."""
        unused = max(0, self._out - n)
        self._out = 0
        self._back += unused

    async def _wait(self, seconds: float) -> None:
        s = self.state
        s.hooks.metric(WAIT_METRIC, 1)
        await wait_set(s.stopping, max(0.0, min(seconds, self.windows.window_ms / 1000 + JITTER)))

    def _wrong(self, key: str, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            self.state.log.error(
                "the rate limit's count %s is not a hash (%s): nothing is read in its window; "
                "delete the key (each window has a key of its own)",
                key,
                exc,
            )


def _count(reply: Any) -> int:
    """An ``HLEN`` reply (an error: none)."""
    return reply if isinstance(reply, int) else 0
