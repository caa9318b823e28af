"""Key and field names of the wire format, shared with the Go client.

Every key of one service carries the hash tag ``{<service>-input}``, so the
load-balancer stream, the consumers' leases and its bookkeeping live in one
cluster slot and multi-key scripts stay legal on Redis Cluster.
"""

from __future__ import annotations

import zlib

from ._placement import SLOTS, shard_name
from .exceptions import ConfigurationError, InvalidInputError

#: The field of an LBS entry that holds the JSON assignment.
INPUT_FIELD = "lbs-input"
#: The Go reference client v0.4's lock key separator (literally this text): its lock of an LBS
#: entry is ``<DataStreamName><MUTEX_KEY_SEP><entry id>``, with the consumer's name as value.
GO_MUTEX_KEY_SEP = "<MUTEX_KEY_SEP>"


def go_lock_key(stream: str, entry_id: str) -> str:
    """The Go reference client's lock key of the LBS entry ``entry_id`` of data stream ``stream``."""
    return f"{stream}{GO_MUTEX_KEY_SEP}{entry_id}"


def validate_service(service: str) -> str:
    """Return ``service`` if it can name an LBS, else raise ConfigurationError."""
    if not isinstance(service, str) or not service:
        raise ConfigurationError(f"service must be a non-empty str, got {service!r}")
    if any(c in service for c in "{}"):
        # A brace would change the hash tag and split the service over slots.
        raise ConfigurationError(f"service must not contain '{{' or '}}': {service!r}")
    return service


def input_stream(service: str) -> str:
    """The load-balancer stream: ``<service>-input``."""
    return f"{service}-input"


def group_name(service: str) -> str:
    """The consumer group every consumer of the service reads in."""
    return f"{service}-group"


def hash_tag(service: str) -> str:
    return "{" + input_stream(service) + "}"


def lock_key(service: str, entry_id: str) -> str:
    """The per-entry lock key of the protocol before the consumer lease: ``lock:{<service>-input}:<entry id>``.

    lbs no longer writes such a key (an entry pending to a consumer is held by that consumer's
    lease, :func:`lease_key`). The name is kept for what still builds it: the core's ``Held``
    records, the demo's key sweep and the benchmark's plain baseline.
    """
    return f"lock:{hash_tag(service)}:{entry_id}"


def key_prefix(service: str) -> str:
    """What keyed processing's keys start with: ``{<service>-input}:`` (the LBS's slot)."""
    return f"{hash_tag(service)}:"


def keyed_stream(service: str, key: str) -> str:
    """The data stream of one key's messages: ``{<service>-input}:k:<key>``."""
    return f"{key_prefix(service)}k:{key}"


def key_state(service: str, key: str) -> str:
    """One key's state (position, holder, registration): ``{<service>-input}:m:<key>``."""
    return f"{key_prefix(service)}m:{key}"


def dead_letter_stream(service: str) -> str:
    """Where poison pills go: ``{<service>-input}:dlq``."""
    return f"{hash_tag(service)}:dlq"


def fence_key(service: str) -> str:
    """The fencing-token counter: ``{<service>-input}:fence``. It only ever grows."""
    return f"{hash_tag(service)}:fence"


def rate_prefix(service: str) -> str:
    """The service's rate limit (``Config.rate_limit``): ``{<service>-input}:rate:``; window ``k``'s
    count is this plus ``k`` (server ms // window ms), a hash (field ``taken``, and one per consumer
    that asked in the window) that expires two windows and a second after its last ask."""
    return f"{hash_tag(service)}:rate:"


def consumers_key(service: str) -> str:
    """The consumer deadline index: ``{<service>-input}:deadlines``.

    A sorted set of the consumer ids with a lease, each scored by the server
    time (ms) by which it must have heartbeated again (the heartbeat moves it
    with the lease's TTL). Recovery's deadline poller looks only at consumers
    past it, and judges each by its lease (gone: its entries are recovered).
    (The per-entry lock protocol kept its index at :func:`lock_protocol_index`.)
    """
    return f"{hash_tag(service)}:deadlines"


def lock_protocol_index(service: str) -> str:
    """Where consumers of the per-entry lock protocol (lbs before the consumer lease) keep their
    deadline index, ``{<service>-input}:consumers``. Under the consumer lease it holds a string, the
    tripwire that refuses such a consumer's reads (:mod:`lbs._consumer.protocol`)."""
    return f"{hash_tag(service)}:consumers"


def lock_protocol_marker(service: str, consumer_id: str) -> str:
    """The per-entry lock protocol's marker of a live process running as ``consumer_id``,
    ``{<service>-input}:instance:<consumer id>`` (refreshed by its heartbeat, with its lock TTL)."""
    return f"{hash_tag(service)}:instance:{consumer_id}"


def reaped_key(service: str) -> str:
    """When the deadline index was last polled (server ms): ``{<service>-input}:reaped``.

    A poll that finds it further back than a stall threshold gives every
    overdue consumer a grace period instead of judging it (reap-3.lua).
    """
    return f"{hash_tag(service)}:reaped"


def delayed_stream(service: str) -> str:
    """The parking stream of delayed retries: ``{<service>-input}:delayed``.

    A failed stream waiting out its retry delay (``Config.retry_delay``) is
    parked here as the copy it will come back as; :func:`due_key` says when.
    """
    return f"{hash_tag(service)}:delayed"


def due_key(service: str) -> str:
    """When parked retries come back: ``{<service>-input}:due``.

    A sorted set of the ids of :func:`delayed_stream`'s entries, each scored
    by the server time (ms) at which any started client moves it back into
    the LBS as a fresh entry (promote-4.lua).
    """
    return f"{hash_tag(service)}:due"


def name_holder(service: str, name: str) -> str:
    """Which registration holds data stream ``name``: ``{<service>-input}:name:<name>``.

    One holder per data stream name, whatever the registrations: the value is
    the holding entry's id (``+`` after it while registrations wait, or
    ``+<id>`` once the oldest waiter is back in the LBS as that entry). The
    scripts build it from :func:`key_prefix` (``_names.lua`` documents it).
    """
    return f"{key_prefix(service)}name:{name}"


def waiting_list(service: str, name: str) -> str:
    """The registrations waiting for data stream ``name``: ``{<service>-input}:waiting:<name>``.

    A list of LBS entry ids, oldest first: each was read while the name was
    held, acked (it stays in the LBS as its own record) and parked here until
    the holder releases the name.
    """
    return f"{key_prefix(service)}waiting:{name}"


def waiting_key(service: str) -> str:
    """The names registrations wait for: ``{<service>-input}:waiting``, a sorted set scored by when
    ``promote-4.lua`` looks at the name again (a holder gone without releasing it)."""
    return f"{key_prefix(service)}waiting"


def queued_prefix(service: str) -> str:
    """``{<service>-input}:queued:``: a consumer's queued set is this plus its consumer id.

    The set holds the entry ids the consumer read for its application but that
    the application has not taken yet (the notification API): merely held, not
    running, so its death counts no retry against them (``requeue-6.lua``).
    """
    return f"{hash_tag(service)}:queued:"


def paused_key(service: str) -> str:
    """The service's pause: ``{<service>-input}:paused``, a hash (``by``, ``reason``, ``since_ms``)
    that exists while the service is paused (:mod:`lbs.controls`).

    Every consumer's take checks it in its ``MULTI`` (a batch read while it exists goes back, no
    retry counted), and its control task reads it once a second (:mod:`lbs._consumer.control`).
    """
    return f"{hash_tag(service)}:paused"


def orders_key(service: str, consumer_id: str) -> str:
    """What operators asked a consumer to do with streams it holds: ``{<service>-input}:orders:<id>``.

    A hash: entry id -> JSON ``{"action": "release" | "cancel" | "drop", "by", "reason", "at"}``,
    which the consumer's control task replaces with its outcome (``"state": "done"``) once it acted;
    the operator's tool reads the outcome and deletes the field (:mod:`lbs.controls`).
    """
    return f"{hash_tag(service)}:orders:{consumer_id}"


def pardons_key(service: str) -> str:
    """Deaths that were no one's fault: ``{<service>-input}:pardons``.

    A sorted set of entry ids, scored by the server time (ms) they were added:
    a holder that lost them while it lived (a partition, a stall past the
    lease's TTL) adds them once it reaches Redis again, and ``requeue-6.lua`` takes
    back the retry another consumer's recovery counted for them. Trimmed to a
    day and to 100,000 members by the holder that adds.
    """
    return f"{hash_tag(service)}:pardons"


def events_stream(service: str) -> str:
    """The service's journal: ``{<service>-input}:events``.

    A capped stream (``MAXLEN ~ Config.journal_maxlen``) of what happened in the
    service, written by every consumer (``lbs._consumer.journal``) and read by
    :func:`lbs.events.read_events`: starts and stops, tallies, failures, dead
    letters, recoveries and who took the streams over.
    """
    return f"{hash_tag(service)}:events"


def lease_prefix(service: str) -> str:
    """The prefix of the consumers' leases, ``{<service>-input}:lease:``; a lease is this plus a consumer id."""
    return f"{hash_tag(service)}:lease:"


def lease_key(service: str, consumer_id: str) -> str:
    """The lease of the process running as ``consumer_id``: ``{<service>-input}:lease:<consumer id>``.

    It holds that process's instance nonce for ``Config.lock_ttl``, extended by every heartbeat
    tick. An entry pending to the consumer in the group is held exactly while its lease lives:
    recovery takes a consumer's entries only once its lease is gone. A second process started with
    the same consumer id is refused while the lease lives; a clean close deletes it.
    """
    return lease_prefix(service) + consumer_id


def tokens_prefix(service: str) -> str:
    """The prefix of the consumers' token records, ``{<service>-input}:tokens:``; one is this plus a
    consumer id.

    A hash per consumer, for ``lbs status``: each batch it read (one fencing token each, shared by the
    batch's entries) as a field, its value the lease value it was taken under, then
    ``|<first id>..<last id>`` (a read: a range of the stream) or ``|<id> <id> ...``; the consumer
    deletes a field once it finished the batch.
    """
    return f"{hash_tag(service)}:tokens:"


def dead_letter_group(service: str) -> str:
    """The consumer group of the dead-letter forwarders: ``<service>-dlq-forwarders``."""
    return f"{service}-dlq-forwarders"


def check_max_input_bytes(max_input_bytes: int) -> int:
    """``max_input_bytes`` if it is a size a producer may send (an int >= 1), else ConfigurationError."""
    if (
        not isinstance(max_input_bytes, int)
        or isinstance(max_input_bytes, bool)
        or max_input_bytes < 1
    ):
        raise ConfigurationError(
            f"max_input_bytes must be a positive integer, got {max_input_bytes!r}"
        )
    return max_input_bytes


# -- sharded LBS: which shard's keys a data stream uses (see lbs.sharding) ---------


def check_shards(shards: int) -> int:
    """``shards`` if it is a shard count (an int >= 1), else ConfigurationError."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= SLOTS:
        raise ConfigurationError(
            f"shards must be an integer from 1 to {SLOTS} (a cluster's slots), got {shards!r}"
        )
    return shards


def shard_services(service: str, shards: int) -> list[str]:
    """The service name of each shard: ``[service]`` for one shard, else shard ``i``'s name, placed
    in the ``i``-th of N equal slot ranges (``service.i``, or ``service.i~j``: :mod:`lbs._placement`)."""
    if check_shards(shards) == 1:
        return [service]
    return [shard_name(service, i, shards) for i in range(shards)]


def shard_of(name: str, shards: int) -> int:
    """The shard a data stream named ``name`` is registered in: ``crc32(utf-8 name) % shards``."""
    if not isinstance(name, str):
        raise InvalidInputError(f"a data stream name is a str, got {type(name).__name__}")
    try:
        return zlib.crc32(name.encode()) % check_shards(shards)
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"data stream name {name!r} is not valid UTF-8: {exc}") from exc
