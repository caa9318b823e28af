"""A fleet never mixes the consumer lease with the per-entry lock protocol (lbs before the lease).

The two cannot share a service: a lock-protocol consumer's recovery re-queues any pending entry
whose lock key is absent, which is every entry a lease consumer holds, and a lease consumer's
recovery re-queues any pending entry whose consumer has no lease, which is every entry a
lock-protocol consumer holds; either way a stream runs twice. So mixed versions are refused,
both ways, for the length of a deploy:

* **A lease consumer refuses to start** while a lock-protocol consumer lives: a member of the old
  deadline index (:func:`lbs._keys.lock_protocol_index`, a sorted set) whose process marker
  (:func:`lbs._keys.lock_protocol_marker`) exists. Its :class:`lbs.ConfigurationError` names them
  and the fix: stop the old fleet first (Kubernetes: ``strategy: Recreate`` for this upgrade, or
  scale the old Deployment to 0), then start the new one.
* **A lock-protocol consumer is refused by Redis**: once none lives, the first lease consumer sets
  the old index's key to a string (:data:`TRIPWIRE`). The lock protocol's reads, heartbeats and
  deadline poller check that key's type first and fail without writing ("LBSKEY ... holds a
  string, not the consumer deadline index"), so an old pod started by a rollback reads nothing.
  Its recovery scan does not look at the key (it re-queues idle entries whose lock key is absent):
  docs/operations.md says to stop the lease consumers before starting old ones. The lease protocol
  keeps its own deadline index under another name.

What dead lock-protocol consumers left pending is recovered by the lease consumers' scan (their
leases do not exist): re-queued under new ids, a retry counted.
"""

from __future__ import annotations

from redis.exceptions import RedisError, ResponseError

from .. import _keys
from .._redis.wire import text
from ..exceptions import ConfigurationError, RedisOperationError
from .state import ClientState

__all__ = ["TRIPWIRE", "refuse_lock_protocol"]

#: What the old deadline index's key holds under the consumer lease.
TRIPWIRE = (
    "lbs consumer lease: this service's consumers run the consumer-lease protocol; a consumer of the "
    "per-entry lock protocol (an lbs from before it) must not run beside them: upgrade it"
)

#: Markers looked at per MGET.
_SLICE = 1000


async def refuse_lock_protocol(state: ClientState) -> None:
    """Refuse to start beside a live lock-protocol consumer; otherwise make sure the tripwire is set.

    Raises :class:`lbs.ConfigurationError` naming the live ones, or :class:`lbs.RedisOperationError`
    when the old index's key holds something else than a sorted set or a string, or Redis refused.
    """
    try:
        await _refuse(state)
    except RedisError as exc:
        raise RedisOperationError("start", exc) from exc


async def _refuse(state: ClientState) -> None:
    s = state
    r = s.link.redis
    service = s.names.service
    key = _keys.lock_protocol_index(service)
    kind = text(await r.type(key))
    if kind == "string":
        return  # the tripwire (or a string of someone else's: the lock protocol is refused either way)
    if kind not in ("zset", "none"):
        raise RedisOperationError(
            "start",
            ResponseError(
                f"{key} holds a {kind}: neither the lock protocol's consumer index (a sorted set) "
                "nor the consumer lease's tripwire (a string); it is lbs's key, delete it"
            ),
        )
    alive: list[str] = []
    members = [text(m) for m in await r.zrange(key, 0, -1)] if kind == "zset" else []
    for at in range(0, len(members), _SLICE):
        some = members[at : at + _SLICE]
        markers = await r.mget([_keys.lock_protocol_marker(service, m) for m in some])
        alive += [m for m, v in zip(some, markers) if v is not None]
    if alive:
        raise ConfigurationError(
            f"{len(alive)} consumers of service {service!r} run the per-entry lock protocol (an lbs "
            f"from before the consumer lease): {', '.join(alive[:10])}"
            f"{' ...' if len(alive) > 10 else ''}. The two protocols cannot run one service together "
            "(each would re-queue the other's streams): stop the old consumers first (Kubernetes: "
            "strategy Recreate for this upgrade, or scale the old Deployment to 0), then start this "
            "version. Their markers are "
            f"{_keys.lock_protocol_marker(service, alive[0])} and so on (they expire with the old "
            "lock TTL once their process stops)"
        )
    await r.set(key, TRIPWIRE)
    if members:
        s.log.warning(
            "%s listed %d consumers of the per-entry lock protocol, none alive: replaced by the consumer "
            "lease's tripwire (what they left pending is recovered under new ids)",
            key,
            len(members),
        )
