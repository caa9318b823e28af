"""A thin blocking facade over :class:`lbs.Client`, for applications without asyncio."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from .client import Client
from .config import Config
from .notifications import DoneStatus, Notification

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient:
    """The same client, driven from ordinary threads.

    An event loop runs in a daemon thread; every method blocks until the
    client's coroutine finished there. ``redis`` must be a URL (an asyncio
    Redis client belongs to another loop). ``run()`` calls a plain function
    per stream in a worker thread.
    """

    def __init__(
        self,
        redis: str,
        service: str,
        consumer_id: str | None = None,
        config: Config | None = None,
        **kwargs: Any,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lbs-sync-loop", daemon=True
        )
        self._thread.start()

        async def make() -> Client:
            return Client(redis, service, consumer_id, config, **kwargs)

        try:
            self.client = self._call(make())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def id(self) -> str:
        """The consumer id (:attr:`lbs.Client.id`)."""
        return self.client.id

    def start(self) -> None:
        """:meth:`lbs.Client.start`, blocking."""
        self._call(self.client.start())

    def notifications(self, timeout: float | None = None) -> Iterator[Notification]:
        """Notifications until the client closes, or until none came for ``timeout`` seconds."""
        while True:
            note = self._call(self.client.next_notification(timeout))
            if note is None:
                return
            yield note

    def done_stream(self, stream: str, entry_id: str | None = None) -> DoneStatus:
        """:meth:`lbs.Client.done_stream`, blocking."""
        return self._call(self.client.done_stream(stream, entry_id))

    def hand_back(
        self, stream: str, entry_id: str | None = None, *, count_retry: bool = False
    ) -> str:
        """:meth:`lbs.Client.hand_back`, blocking; returns the new entry id."""
        return self._call(self.client.hand_back(stream, entry_id, count_retry=count_retry))

    def claim(self, entry_id: str) -> bool:
        """:meth:`lbs.Client.claim`, blocking."""
        return self._call(self.client.claim(entry_id))

    def run(self, handler: Callable[[Notification], Any], concurrency: int | None = None) -> None:
        """Call ``handler(notification)`` in worker threads until :meth:`close` (from another thread)."""

        async def call(note: Notification) -> Any:
            return await asyncio.to_thread(handler, note)

        self._call(self.client.run(call, concurrency))

    def close(self) -> None:
        """:meth:`lbs.Client.close`, blocking; then stops the client's event loop thread."""
        if self._loop.is_closed():
            return
        try:
            self._call(self.client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncClient:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
