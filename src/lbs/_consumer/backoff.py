"""Back-off between retries: doubling, capped, jittered (so a fleet does not retry in step)."""

from __future__ import annotations

import asyncio
import random

from .._waits import wait_set

__all__ = ["Backoff"]


class Backoff:
    """Delays for one retry loop: each a uniform draw in ``[d/2, d]``, ``d`` doubling up to ``maximum``."""

    __slots__ = ("delay", "initial", "maximum")

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.delay = initial

    def reset(self) -> None:
        """After a success: the next failure waits ``initial`` again."""
        self.delay = self.initial

    def next(self) -> float:
        """The next wait, in seconds; the one after is about twice as long."""
        wait = random.uniform(self.delay / 2, self.delay)
        self.delay = min(self.delay * 2, self.maximum)
        return wait

    async def sleep(self, stop: asyncio.Event | None = None, wait: float | None = None) -> None:
        """Wait :meth:`next` seconds (or ``wait``), or until ``stop`` is set."""
        wait = self.next() if wait is None else wait
        if stop is None:
            await asyncio.sleep(wait)
            return
        await wait_set(stop, wait)
