"""Where a sharded service's shards live: each shard's name, chosen so that its hash slot falls at the
middle of its own N-th of the slot space, so that a cluster whose masters own equal slot ranges
carries every shard of every service evenly, whatever the service's name.

A service's keys share the hash tag ``{<name>-input}`` (the LBS is ``<name>-input``), so a shard's
slot is ``CRC16("<name>-input") mod 16384``. Shard ``i`` of ``n`` (``n`` >= 2) of service ``s`` is
named by the first ``j = 0, 1, 2, ...`` whose candidate name's slot falls in the shard's window:

* candidate ``j``: ``s.i`` for ``j = 0`` (the name every earlier lbs gave shard ``i``: a shard that
  was in place keeps its name and its keys), else ``s.i~j``;
* the shard's window: the slots within ``w`` of ``c = floor((2i + 1) x 16384 / 2n)``, the middle
  of the ``i``-th of ``n`` equal ranges, ``w = min(8, floor(16384 / 4n))``.

Masters owning equal ranges (``redis-cli --cluster create`` rounds each boundary to a slot): master
``k`` of ``M`` holds the shards whose middle ``(i + 1/2) / n`` lies in ``[k / M, (k + 1) / M)``,
which is exactly ``n / M`` shards when ``n`` is a multiple of ``M`` and ``n / M`` rounded down or
up otherwise (for ``n x M`` up to about 2,000: a window never straddles a boundary). A window holds
``2w + 1`` of the 16384 slots: about a thousand candidates are tried per shard (a millisecond; the
names are cached). Any client in any language computes the same names from this paragraph and
CRC16 (XMODEM), as Redis Cluster specifies it.

A shard whose name changed (``s.i`` was not in its window) leaves its earlier keys behind: the
consumers (:class:`lbs.ShardedClient`) also read such a *legacy* shard while its LBS exists, so what
producers of an earlier lbs wrote there is served during a rolling upgrade; the operator deletes it
once it is empty (``lbs status --shards N`` lists it). :func:`legacy_names` says which they are.
"""

from __future__ import annotations

from functools import lru_cache

from redis.crc import key_slot

__all__ = ["REACH", "SLOTS", "legacy_names", "shard_name", "shard_range", "slot_of"]

#: The hash slots of a Redis Cluster.
SLOTS = 16384
#: The most slots a shard's window reaches either side of its middle.
REACH = 8


def slot_of(name: str) -> int:
    """The hash slot of service ``name``'s keys (its LBS, ``<name>-input``, and ``{<name>-input}:*``)."""
    return int(key_slot(f"{name}-input".encode()))


def shard_range(i: int, n: int) -> tuple[int, int]:
    """The slots ``[lo, hi)`` shard ``i`` of ``n`` must fall in: its window (see the module)."""
    middle = (2 * i + 1) * SLOTS // (2 * n)
    reach = min(REACH, SLOTS // (4 * n))
    return middle - reach, middle + reach + 1


@lru_cache(maxsize=65536)
def shard_name(service: str, i: int, n: int) -> str:
    """The name of shard ``i`` of ``n`` (>= 2) of ``service`` (see the module)."""
    lo, hi = shard_range(i, n)
    j = 0
    while True:
        name = f"{service}.{i}" if j == 0 else f"{service}.{i}~{j}"
        if lo <= slot_of(name) < hi:
            return name
        j += 1


def legacy_names(service: str, n: int) -> list[str]:
    """The shards that earlier lbs versions named ``service.i`` and that have another name now."""
    if n < 2:
        return []
    return [f"{service}.{i}" for i in range(n) if shard_name(service, i, n) != f"{service}.{i}"]
