"""Test hooks: end a client as if its process died, and look inside one. For tests only.

Tests of an application (and lbs's own) need two things the public API
deliberately lacks:

* :func:`abandon` ends a client **as if its process were killed** (kill -9):
  its tasks stop, its connections close, and nothing is handed back,
  finished, acknowledged or released. Redis keeps what a dead consumer
  leaves: its lease, which lapses after ``Config.lock_ttl``, its pending
  entries, its place in the deadline index. Other consumers recover its
  streams once the lease is gone, as they would a dead process's.
  ``close()`` afterwards does nothing.
* :func:`freeze` stops a client's reading and heartbeat only: a stalled
  process, or one cut off from Redis. Its lease lapses while it lives on (it
  can still be closed, and its connections still work).
* :func:`probe` gives documented access to a client's activities and state
  (:class:`Probe`), for tests that check how lbs works inside.

Nothing here is for production code, and :class:`Probe`'s members follow
lbs's internals: they change when those do. ::

    from lbs.testing import abandon

    await abandon(worker)  # as if killed: another consumer recovers its streams

.. versionadded:: 0.1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _lbscore import Held

    from ._consumer.delays import Delays
    from ._consumer.heartbeat import Heartbeat
    from ._consumer.reader import Reader
    from ._consumer.recovery import Recovery
    from ._consumer.requeue import Requeue
    from ._consumer.state import ClientState, Link
    from ._consumer.topology import Topology
    from .client import Client

__all__ = ["Probe", "abandon", "freeze", "probe"]


async def abandon(client: Client) -> None:
    """End ``client`` as if its process were killed: tasks stopped, connections closed, nothing
    handed back, finished or released (see the module docstring)."""
    await client._life.abandon()


async def freeze(client: Client) -> None:
    """Stop ``client``'s reading and heartbeat, nothing more: a stalled process (its lease lapses)."""
    await client._life.freeze()


def probe(client: Client) -> Probe:
    """Documented access to ``client``'s internals, for tests."""
    return Probe(client)


class Probe:
    """One client's activities and state, as tests read (and nudge) them.

    Each member names what lbs's own tests look at; see :mod:`lbs._consumer`
    for what each activity does.
    """

    def __init__(self, client: Client) -> None:
        life = self._life = client._life
        #: What the client's activities share; build an activity under test from it.
        self.state: ClientState = life.state
        #: The reading task (``task``, ``blocked`` waiting in a blocking XREADGROUP, ``reply_lost``).
        self.reader: Reader = life.reader
        #: The heartbeat task (``task``, ``tick``, ``lease_until``: the local lease).
        self.heartbeat: Heartbeat = life.heartbeat
        #: Every hand-back and re-queue (``pardon``, ``send``: one batch of ``requeue-6.lua`` calls).
        self.requeue: Requeue = life.requeue
        #: The task that brings parked retries back when due (``promote``, ``stop``, ``task``).
        self.delays: Delays = life.requeue.delays
        #: Routing, the group, the server's features (``ensure_group``).
        self.topology: Topology = life.topology
        #: Recovery's tasks (``listening``: set while the keyspace listener is subscribed).
        self.recovery: Recovery = life.recovery

    @property
    def link(self) -> Link:
        """The client's connections to Redis now (its wires; a moved slot replaces them)."""
        return self.state.link

    @property
    def buffered(self) -> int:
        """How many notifications wait in the client's buffer."""
        return len(self.state.mailbox)

    def lose_read_reply(self) -> None:
        """As if the last read's reply were lost: the next read re-reads this consumer's pending
        entries first (and takes them again)."""
        self.reader.lose_reply()

    def stop_reading(self) -> None:
        """Set the client's stopping flag (what ``close()`` does first): every loop ends."""
        self.state.stopping.set()

    def settle(self, entry_id: str) -> None:
        """As if a keyed commit that may let ``entry_id``'s key go were in flight (``Holdings.settling``)."""
        self.state.holdings.settling.add(entry_id)

    def hold(self, h: Held) -> None:
        """Make the client believe it holds ``h`` (as a second process might)."""
        self.state.holdings.table.add(h)
