"""Lingering keys under ``run_keyed()``: a drained key stays held for ``linger`` seconds, woken by publish.

A key whose messages are all processed is kept, running nothing, instead of being let go at once
(``commit-1.lua`` ``stay:<n>``: the key's state says ``idle:<token>``, so a death meanwhile is not
counted against messages published later; ``lingers`` is set with it). ``publish-1.lua`` wakes
the holder of every lingering key it appends to, one ``SPUBLISH {<service>-input}:wake:<consumer
id> <JSON array of keys>`` per consumer per call: the holder reads each key's messages in its next
round trip (``HDEL idle:<token> lingers`` first, then ``XRANGE``) and runs them, with no
registration, read, take or fetch. A quiet key that gets a message every second or so stays with
its holder; a key that gets none for ``linger`` seconds is let go with a
``last:<n>`` commit, which also hands over any message whose wake was lost (a wake is a hint: losing
one costs latency up to ``linger``, never a message).

One Pub/Sub connection per client (:class:`lbs._redis.subscription.Subscription`, ``SSUBSCRIBE``
on the LBS slot's owner), PINGed every ``Config.pubsub_ping_interval`` and opened again when it drops
or goes half-open; after each (re)subscription every lingering key is woken once (wakes sent while
it was away were lost). A wake that arrives while its key's commit is in flight is remembered
(:meth:`Lingering.woke`) and acted on if that commit leaves the key lingering.

Lingering pays when keys come back: a key woken saves a registration, a read, a take, a fetch and
a let-go (about three scripts' worth of Redis), one let go unwoken costs one more commit step than
letting it go at once. So :meth:`Lingering.worth` keeps count of the last keys that lingered: while
fewer than :data:`WORTH` of them were woken before their linger ended (keys too many and too quiet
to come back in time, e.g. 100,000 keys each with a message a minute), drained keys are let go at
once, except one in :data:`PROBE`, which lingers to keep the count current. Nor does a key linger
while the consumer drains a backlog (its last read got all the several entries it asked for): new
keys wait for it anyway.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from .._redis.subscription import Subscription
from .._waits import wait_set
from .backoff import Backoff
from .keyhold import KeyHold
from .state import ClientState

__all__ = ["Lingering"]

#: How long a wake for a key that was not lingering is remembered (seconds): longer than any commit
#: round trip that may still leave its key lingering.
RECENT = 30.0
#: Lingering is kept up while at least this share of the keys that lingered were woken in time.
WORTH = 0.5
#: While it is not, one drained key in this many lingers all the same (the count stays current).
PROBE = 10
#: The count covers about this many of the last keys that lingered (older ones weigh half, ...).
WINDOW = 200


class Lingering:
    """The drained keys one client keeps, oldest first, their expiry and their wakes."""

    def __init__(
        self,
        state: ClientState,
        linger: float,
        resume: Callable[[KeyHold], None],
        let_go: Callable[[KeyHold], None],
    ) -> None:
        self.state, self.linger = state, linger
        #: Called for a lingering key that was woken (the runner reads its messages).
        self.resume = resume
        #: Called for a key that lingered ``linger`` seconds (the runner commits ``last:<n>``).
        self.let_go = let_go
        #: Lingering keys by name, in the order they started lingering.
        self.holds: dict[str, KeyHold] = {}
        #: Wakes of keys that were not lingering: key -> when (monotonic).
        self._recent: dict[str, float] = {}
        self._changed = asyncio.Event()
        #: The wake listener and the expiry timer, once started.
        self.tasks: list[asyncio.Task[None]] = []
        self.channel = f"{state.names.key_prefix}wake:{state.names.id}"
        #: Set while the wake subscription is open (tests wait for it).
        self.listening = asyncio.Event()
        #: Keys whose linger ended, and those of them woken first (halved every WINDOW endings).
        self.ended = self.woken = 0.0
        self._skipped = 0
        #: Set by :meth:`close`: a key found drained from then on is let go, not kept.
        self.closed = False

    def __len__(self) -> int:
        return len(self.holds)

    def worth(self) -> bool:
        """Whether a key found drained should linger (see the module): yes while enough of the keys
        that lingered came back in time, or for too few keys to tell; else one in :data:`PROBE`."""
        if self.ended < PROBE or self.woken >= WORTH * self.ended:
            return True
        self._skipped += 1
        return self._skipped % PROBE == 0

    def count(self, woken: bool) -> None:
        """A key's linger ended: ``woken`` by a message, or not (let go)."""
        self.ended += 1
        self.woken += woken
        if self.ended >= WINDOW:
            self.ended, self.woken = self.ended / 2, self.woken / 2

    def start(self) -> None:
        if not self.tasks:
            n = self.state.names.id
            self.tasks = [
                asyncio.create_task(self._listen(), name=f"lbs-keyed-wakes-{n}"),
                asyncio.create_task(self._expire(), name=f"lbs-keyed-linger-{n}"),
            ]

    def enter(self, hold: KeyHold, sent_at: float) -> None:
        """``hold``'s commit (sent at ``sent_at``) found the key drained: it lingers, or resumes at
        once when a wake came since that commit was sent."""
        key = hold.held.stream
        woke = self._recent.pop(key, None)
        if woke is not None and woke >= sent_at:
            self.resume(hold)
            return
        hold.lingering = time.monotonic()
        self.holds[key] = hold
        self.state.holdings.lingering.add(hold.held.entry_id)
        self.state.holdings.free()  # its slot: the reader reads again
        if len(self.holds) == 1:
            self._changed.set()  # the first: the timer waits for nothing earlier

    def leave(self, key: str) -> KeyHold | None:
        """Stop keeping ``key``; its hold, or None when it was not lingering."""
        hold = self.holds.pop(key, None)
        if hold is not None:
            hold.lingering = 0.0
            self.state.holdings.lingering.discard(hold.held.entry_id)
        return hold

    def woke(self, key: str, *, counted: bool = True) -> None:
        """A wake for ``key``: resume it when it lingers, else remember it (its commit may be in flight).
        ``counted``: a wake from publish (not the catch-up after a reconnection) counts for
        :meth:`worth`."""
        hold = self.leave(key)
        if hold is None:
            self._recent[key] = time.monotonic()
        elif self._held(hold):
            if counted:
                self.count(True)
            self.resume(hold)

    def _held(self, hold: KeyHold) -> bool:
        return self.state.holdings.table.get(hold.held.entry_id) is hold.held

    def close(self) -> list[KeyHold]:
        """Stop listening and expiring; the keys still lingering (and held), to be let go."""
        self.closed = True
        for t in self.tasks:
            t.cancel()
        holds = [h for h in (self.leave(k) for k in list(self.holds)) if h is not None]
        return [h for h in holds if self._held(h)]

    async def wait_closed(self) -> None:
        tasks, self.tasks = self.tasks, []
        if tasks:
            await asyncio.wait(tasks)

    # -- the tasks ---------------------------------------------------------------------------

    async def _expire(self) -> None:
        """Let go the keys that lingered ``linger`` seconds, oldest first (they linger in the order
        they came, so it waits for the first alone); forget old wakes every :data:`RECENT` seconds."""
        prune_at = time.monotonic() + RECENT
        while True:
            now = time.monotonic()
            if now >= prune_at:
                self._recent = {k: t for k, t in self._recent.items() if now - t <= RECENT}
                prune_at = now + RECENT
            wait = prune_at - now
            while self.holds:
                key, hold = next(iter(self.holds.items()))
                due = hold.lingering + self.linger
                if due > now:
                    wait = min(wait, due - now)
                    break
                self.leave(key)
                if self._held(hold):
                    self.count(False)
                    self.let_go(hold)
            self._changed.clear()
            await wait_set(self._changed, wait)

    async def _listen(self) -> None:
        """Read this consumer's wakes; reconnect on drops and half-open links."""
        s = self.state
        cfg = s.config
        backoff = Backoff(cfg.read_retry_initial, cfg.read_retry_max)
        ping_every = cfg.pubsub_ping_interval
        while not s.stopping.is_set():
            sub = Subscription(s.link.redis)  # on the slot's owner: where publish-1.lua runs
            link = s.link
            try:
                await sub.open(self.channel, command="SSUBSCRIBE")
                self.listening.set()
                backoff.reset()
                # Wakes sent while nobody listened were lost: look at every lingering key once.
                for key in list(self.holds):
                    self.woke(key, counted=False)
                while True:
                    for msg in await sub.heard(ping_every):
                        if type(msg) is list and len(msg) == 3 and msg[0] == b"smessage":
                            keys = _wake_keys(msg[2])
                            if keys is None:
                                s.log.warning(
                                    "a message on %s that is not a wake (a JSON array of keys): "
                                    "%.200r; ignored",
                                    self.channel,
                                    msg[2],
                                )
                            for key in keys or ():
                                self.woke(key)
                    if s.link is not link:
                        raise ConnectionError(f"the slot moved to {s.link.node}: resubscribing")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                if s.denied(exc, "listening for keyed wakes"):
                    wait = cfg.read_retry_max
                else:
                    wait = backoff.next()
                    s.log.warning(
                        "keyed wake listener lost (%s); lingering keys are let go after %.1fs "
                        "meanwhile; resubscribing in %.2fs",
                        exc,
                        self.linger,
                        wait,
                    )
                await asyncio.sleep(wait)
            finally:
                self.listening.clear()
                try:
                    await sub.close()
                except Exception:
                    pass


def _wake_keys(payload: bytes) -> list[str] | None:
    """The keys of a wake (``publish-1.lua``: a JSON array of strings); None for a payload that is
    not one."""
    try:
        keys = json.loads(payload)
    except ValueError:
        return None
    if type(keys) is not list or any(type(k) is not str for k in keys):
        return None
    return keys
