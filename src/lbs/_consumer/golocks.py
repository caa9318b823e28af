"""Go-style locks beside lbs's own (``Config.go_compatible``): the only caller of ``golocks-n.lua``.

Consumers of the Go reference client v0.4 know a stream is held by its lock
``<DataStreamName><MUTEX_KEY_SEP><entry id>`` (value: the holder's name) and
recover it when that lock expires (``StreamExpired``, then ``Claim``:
XCLAIM at 2 s idle). So that they see lbs's work as held, and take a dead
lbs consumer's streams over, an lbs consumer in this mode holds such a lock
for every stream it holds:

* the heartbeat sets or extends them after each tick (:meth:`GoLocks.keep`),
  for ``max(lock_ttl, 4 s)``: when lbs dies, the lock outlives Go's 2-s
  claim idle, so Go's XCLAIM succeeds; a lock that holds another name means
  a Go consumer took the entry, and lbs lets it go (disowned);
* done and hand-back release them right behind their own scripts, in the
  same round trip (:meth:`GoLocks.release_in`). Not atomically with them: a
  Go-style lock left by a lost reply expires, and the Go consumer's Claim
  then finds the entry gone (XCLAIM of an acknowledged or deleted entry
  takes nothing).

A stream taken by a read gets its Go-style lock at the next tick (at most
2 s later in this mode); until then nothing in Go looks at it (its reader
only reads new entries, its start-up XAUTOCLAIM only entries idle 4 s).
"""

from __future__ import annotations

from collections.abc import Sequence

from _lbscore import CommandBatch, Held

from .. import _keys
from .._redis import scripts
from .._redis.wire import first_error
from ..config import GO_MIN_IDLE
from .state import ConsumerState

__all__ = ["GoLocks"]


class GoLocks:
    """Keeps and releases one client's Go-style locks (a no-op unless ``Config.go_compatible``)."""

    def __init__(self, state: ConsumerState) -> None:
        self.state = state
        self.enabled = state.config.go_compatible
        self.ttl_ms = max(state.config.lock_ttl_ms, int(GO_MIN_IDLE * 1000))

    async def keep(self, held: Sequence[Held]) -> list[Held]:
        """Set or extend the Go-style lock of each of ``held``; those whose lock a Go consumer holds."""
        if not self.enabled or not held:
            return []
        s = self.state
        keys = [_keys.go_lock_key(h.stream, h.entry_id) for h in held]

        def build(b: CommandBatch) -> None:
            scripts.go_locks(b, keys, s.names.id, "keep", self.ttl_ms)

        (others,) = first_error(await s.link.beat.execute(build, retry_safe=True))
        return [held[i - 1] for i in others]

    def release_in(self, b: CommandBatch, held: Sequence[Held]) -> int:
        """Add the release of ``held``'s Go-style locks that are still ours to ``b``, the batch of the
        caller's own release (done-n, requeue-5), right behind it; how many commands were added (0 or
        1: the reply is the caller's to skip). Best effort: a lock a lost reply leaves expires."""
        if not self.enabled or not held:
            return 0
        scripts.go_locks(b, [_keys.go_lock_key(h.stream, h.entry_id) for h in held], self.state.names.id,
                         "release")
        return 1
