"""Slots shared by several clients of one process: the shards of a :class:`lbs.ShardedClient`.

A sharded consumer runs one client per shard, and ``max_streams`` (or ``run()``'s ``concurrency``)
is the process's, not each shard's: split N ways, each shard's reads would ask for
``max_streams / N / 2`` entries (four at N = 12 with the defaults: Redis pays its per-read cost
for every four assignments), and a backlog in one shard would get a N-th of the process. Shared,
every shard's reader asks for what the whole process has free, as one client's does.

What is free, seen by one member: the capacity less what every member holds (its handlers under
``run()``; lingering keys take none) and less what the *other* members' reads of new entries in
flight asked for (:attr:`lbs._consumer.state.ClientState.reading`), so reads sent at the same
time by several shards never take more than the capacity together. A member's own read in flight
is its reader's to count, as for one client. A slot freed in any member, or a read that took
less than it asked, wakes every member's reader (each waits on its own
:attr:`~lbs._consumer.state.Holdings.freed`).

A member's waiting read (the LBS drained, a blocking ``XREADGROUP``) asks for at most
:data:`WAITING_READ` entries: a blocked read is served by the first ``XADD``, with the one entry
there is then, and a larger ask would only keep slots from the shards that have a backlog. A read
that does not wait asks for a ramp (:data:`RAMP_FROM` after a drained read, doubled by each full
one, up to ``read_count``) and, while another member's read is in flight, is not sent for less
than half of it: shards with a backlog take the free slots in turns, in batches (Redis pays per
read, not per entry), not all in slivers, and a trickle keeps few slots reserved (a waiting read's
reply that finds no slot free goes back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import ClientState

__all__ = ["RAMP_FROM", "WAITING_READ", "SharedSlots"]

#: Most entries a member's blocking read asks for.
WAITING_READ = 2
#: What a member's read not waiting in Redis asks for after a read that drained its LBS (doubled by
#: each read that gets all it asked for, up to ``read_count``; no read is sent for less than half).
RAMP_FROM = 4


class SharedSlots:
    """One capacity counted over several clients' holdings and reads (see the module)."""

    def __init__(self) -> None:
        self._members: list[ClientState] = []

    def join(self, member: ClientState) -> None:
        """Count ``member``'s holdings and reads in this capacity from now on."""
        self._members.append(member)

    def free(self, member: ClientState, taking: int) -> int:
        """How many more streams ``member`` may take now, ``taking`` of them being taken already."""
        used = 0
        for m in self._members:
            held = len(m.holdings) - len(m.holdings.lingering)
            used += max(held, len(m.handlers)) if m.run_limit else held
            if m is not member:
                used += m.reading
        return member.capacity - used - taking

    def read_elsewhere(self, member: ClientState) -> bool:
        """Whether a member other than ``member`` has a read of new entries in flight."""
        return any(m.reading for m in self._members if m is not member)

    def wake(self, member: ClientState) -> None:
        """``member`` freed a slot, or a read of it took less than it asked: the others look again."""
        for m in self._members:
            if m is not member:
                m.holdings.freed.set()
