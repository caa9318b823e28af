"""This process's consumer lease, as the client tracks it: the value of each take, and which take
Redis holds (the key itself, ``{<service>-input}:lease:<id>``, is written by the heartbeat and
:class:`lbs._consumer.instance.Instance`)."""

from __future__ import annotations

import asyncio

from .._waits import wait_set

__all__ = ["Lease"]


class Lease:
    """This process's lease value: what ``{<service>-input}:lease:<id>`` holds while the process holds
    it, its instance nonce at start, ``<instance nonce>.<n>`` when it takes the lease an n-th time
    (after it lapsed while the process lived). Each take has its own value, so a write built under a
    lapsed take (a read, a done, a hand-back still in flight) is refused by the scripts: what was
    read under it may be another consumer's by now."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.takes = 1
        #: The last take Redis confirmed (the first is the start's).
        self.held = 1
        self._took = asyncio.Event()

    @property
    def value(self) -> str:
        return self.instance if self.takes == 1 else f"{self.instance}.{self.takes}"

    def next(self) -> str:
        """The value of the next take."""
        self.takes += 1
        return self.value

    def took(self) -> None:
        """Redis holds the lease under :attr:`value` again (the heartbeat took it back)."""
        self.held = self.takes
        self._took.set()

    async def taken_after(self, take: int, timeout: float) -> None:
        """Wait, up to ``timeout`` seconds, until a take later than ``take`` is held (a read refused
        under a lapsed take goes again as soon as the heartbeat took the lease back)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.held <= take:
            self._took.clear()
            left = deadline - loop.time()
            if left <= 0:
                return
            await wait_set(self._took, left)
