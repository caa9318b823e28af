"""The keyed sender's round trips: every key's next step batched, two round trips in flight.

:class:`~lbs._consumer.keyed.KeyedRunner` queues each key's next step (a fetch, a commit, a
lingering key's read); :class:`Sender` takes what is queued as one :class:`Round` and sends it on a
free keyed wire of the link (two connections): Redis works on one batch while the client
dispatches the replies of another. A key has at most one step queued or in flight, so rounds in
flight never share a key. A round that fails is sent again after a back-off (read again from the
link each try: the slot may move); one whose scripts Redis lost (a restart, a failover) loads them
and goes again: they ran nowhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from _lbscore import CommandBatch

from .._redis.scripts import KeyCommit
from .backoff import Backoff
from .keyhold import KeyHold
from .state import ClientState

__all__ = ["Round", "Sender"]


class Round(NamedTuple):
    """One round trip's steps: keys newly taken, finished batches, lingering keys woken."""

    fetch: list[KeyHold]
    commit: list[tuple[KeyHold, KeyCommit]]
    resume: list[KeyHold]


class Sender:
    """Sends the rounds ``take`` hands it until none is queued or in flight."""

    def __init__(
        self,
        state: ClientState,
        wake: asyncio.Event,
        take: Callable[[], Round | None],
        build: Callable[[CommandBatch, Round], None],
        replies: Callable[[Round, list[Any]], None],
    ) -> None:
        self.state, self.wake, self.take = state, wake, take
        self.build, self.replies = build, replies
        self._backoff = Backoff(state.config.read_retry_initial, state.config.read_retry_max)

    async def run(self) -> None:
        inflight: dict[asyncio.Task[None], int] = {}  # round trip -> the keyed wire it uses
        free = list(range(len(self.state.link.keyed)))
        try:
            await self._send(inflight, free)
        finally:
            for t in inflight:  # cancelled (close): the round trips in flight end with it
                t.cancel()
            if inflight:
                await asyncio.wait(inflight)

    async def _send(self, inflight: dict[asyncio.Task[None], int], free: list[int]) -> None:
        while True:
            rnd = self.take() if free else None
            if rnd is not None:
                k = free.pop()
                inflight[asyncio.create_task(self._round_trip(k, rnd))] = k
                # Its request goes out; handlers that finish at once queue more.
                await asyncio.sleep(0)
                continue
            if not inflight:
                return
            self.wake.clear()
            woken = asyncio.ensure_future(self.wake.wait())
            try:
                done, _ = await asyncio.wait(
                    (*inflight, woken), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                woken.cancel()
            for t in list(inflight):
                if t in done:
                    free.append(inflight.pop(t))

    async def _round_trip(self, k: int, rnd: Round) -> None:
        """One round on the link's keyed wire ``k``.

        Its commits may let their keys go (the LBS entry acked and deleted): until the replies are
        in, a heartbeat that finds the lease lapsed does not count those keys lost but leaves them to
        the replies (``Holdings.settling``)."""
        s = self.state
        ids = [hold.held.entry_id for hold, _ in rnd.commit]
        s.holdings.settling.update(ids)
        now = time.monotonic()
        for hold, _ in rnd.commit:
            hold.sent_at = now
        try:
            await self._attempts(k, rnd)
        finally:
            s.holdings.settling.difference_update(ids)

    async def _attempts(self, k: int, rnd: Round) -> None:
        s = self.state
        while True:
            wire = s.link.keyed[k]
            try:
                replies = await wire.execute(lambda b: self.build(b, rnd))
            except Exception as exc:
                s.log.warning("keyed batch failed (%s); trying again", exc)
                await self._backoff.sleep(s.stopping)
                if s.stopping.is_set():
                    return  # the keys stay held: close() hands them back
                continue
            self._backoff.reset()
            if any(isinstance(r, NoScriptError) for r in replies):
                # A restart or a failover emptied the script cache: the scripts ran nowhere (and wrote no
                # effect: they are commit-1.lua's).
                s.log.info("Redis lost the scripts (restarted or failed over); loading them again")
                try:
                    await wire.load_scripts()
                except Exception as exc:
                    s.log.warning("loading the scripts failed (%s); trying again", exc)
                    await self._backoff.sleep(s.stopping)
                continue
            self.replies(rnd, replies)
            return
