"""Every tunable of the client, with its default, in one validated object."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .exceptions import ConfigurationError

__all__ = ["Config", "require_number"]


def require_number(
    value: object,
    rule: str,
    *,
    integer: bool = False,
    low: float = 0,
    above: bool = False,
    finite: bool = False,
) -> None:
    """Raise :class:`lbs.ConfigurationError` "<rule>, got <value!r>" unless ``value``
    is a number (an ``int`` with ``integer``; never a bool) of at least ``low`` (above it with
    ``above``), and finite with ``finite``. NaN never passes."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int if integer else (int, float))
        or not (value > low if above else value >= low)
        or (finite and not math.isfinite(value))
    ):
        raise ConfigurationError(f"{rule}, got {value!r}")


#: The Go reference client v0.4's shortest start-up XAUTOCLAIM idle time (``WithLBSIdleTime``), seconds.
GO_MIN_IDLE = 4.0
#: The Go client's ``hbInterval`` (seconds): its ``Claim`` takes an entry idle that long once its lock expired.
GO_CLAIM_IDLE = 2.0
#: The Go client's ``DoneStream`` deletes its lock, then XACKs in another round trip: beside a Go fleet
#: the scan re-queues entries it found with neither lock (ours, Go-style) this long (seconds) after
#: that look, so that one between the two is found acked.
GO_DONE_GAP = 1.0


@dataclass(frozen=True, kw_only=True)
class Config:
    """Settings of an :class:`lbs.Client`. Durations are in seconds.

    Invalid values raise :class:`lbs.ConfigurationError` when the Config is
    built, with the field's name in the message; so do unknown fields (with
    the closest field's name, for a typo) and positional arguments.
    """

    # -- the lease and the heartbeat ------------------------------------------

    #: The TTL of the consumer's lease, ``{<service>-input}:lease:<consumer id>`` (the name is
    #: from when lbs took a lock per entry): every entry pending to the consumer is held while
    #: the lease lives. A consumer that stops heartbeating loses its lease, and with it every
    #: stream it holds, after this long; recovery then takes them.
    lock_ttl: float = 10.0
    #: Seconds between heartbeats; ``None`` means ``lock_ttl / 3``, which leaves room for
    #: one failed tick (a dropped connection) before the lease can expire.
    heartbeat_interval: float | None = None
    #: No longer used since the consumer lease: a tick extends one key, the lease, whatever is
    #: held (beside a Go fleet, every held entry's Go-style lock goes in that same call). It
    #: sliced the locks a tick extended per script call when lbs took a lock per entry; it is
    #: still accepted (and checked), to no effect.
    heartbeat_chunk: int = 1_000
    # -- reading --------------------------------------------------------------

    #: Most data streams this consumer holds at once; reads never exceed the free capacity.
    max_streams: int = 100
    #: Most entries one read (its XREADGROUP) asks for, capped by the free capacity.
    #: After a full read the next one is sent before the batch is dispatched, when the
    #: capacity left allows it. ``None``: half the capacity (``max_streams``, or ``run()``'s
    #: ``concurrency``), at most 500, so Redis reads the next batch while this one is handed out.
    read_count: int | None = None
    #: Fair dispatch: while other consumers of the group read in the last
    #: ``max(5 s, 3 x read_block)`` (live peers), a read takes no more than this consumer's
    #: share of what waits and what the live consumers hold
    #: (``ceil((waiting + held) / (live peers + 1)) - held by it``), so a few long
    #: registrations spread over idle consumers instead of going to the first that reads. A
    #: consumer that has taken its share looks again once a slot of its own frees, or soon.
    #: Costs one ``XINFO GROUPS`` and one ``XINFO CONSUMERS`` (one round trip) per read after a
    #: full one, fewer while no peer limits the share; a blocking read (after the group drained)
    #: takes at most two entries and looks at nobody.
    #: ``False``: every read takes up to ``read_count``.
    fair_dispatch: bool = True
    #: How long the reader waits for new entries (a blocking XREADGROUP) after a read that drained
    #: the group, before it reads again anyway.
    #: Bounded, so shutdown is prompt even without cancellation.
    read_block: float = 1.0
    #: First back-off after a failed read; doubles, with jitter, up to ``read_retry_max``.
    read_retry_initial: float = 0.1
    #: Longest back-off between failed reads.
    read_retry_max: float = 30.0
    #: Failed reads in a row before the reader gives up with STREAM_TERMINATED:
    #: ``-1`` retries forever, ``0`` gives up at the first failure.
    read_max_retries: int = -1
    # -- entries, retries and dead letters ------------------------------------

    #: Prefix of the fields lbs manages in entries (``_retry_count``, ``_original_id``).
    field_prefix: str = "_"
    #: Where poison pills and malformed entries go. ``None``: ``{<service>-input}:dlq``.
    #: ``""``: log and drop them (an explicit opt-in to losing them).
    dead_letter_stream: str | None = None
    #: Dead letters a forwarder hands its backend per write (hook ``lbs_dead_letter_backend``).
    dead_letter_batch: int = 100
    #: A dead letter another forwarder left unconfirmed this long is taken over (seconds).
    dead_letter_claim_idle: float = 60.0
    #: Failed attempts (``_retry_count``) after which an assignment is dead-lettered.
    max_retries: int = 3
    #: A failed ``run()`` handler's stream comes back after this many seconds at its
    #: first retry, doubling per retry (jittered: uniform in [d/2, d]) up to
    #: ``retry_delay_max``. The wait is kept in Redis, so it survives restarts.
    #: ``0``: at once.
    retry_delay: float = 1.0
    #: Longest wait before a retry (seconds).
    retry_delay_max: float = 300.0
    #: Largest ``lbs-input`` value accepted; a bigger one is dead-lettered.
    max_input_bytes: int = 65_536
    # -- the application's side -----------------------------------------------

    #: Notifications buffered before the reader waits for the application (backpressure).
    notification_buffer: int = 1024
    #: On ``close()`` (or SIGTERM/SIGINT under ``run()``), how long to let running
    #: ``run()`` handlers finish before their streams are handed back (a second signal cuts it
    #: short). 20 s fits Kubernetes' default 30 s grace period with time left for the hand-back;
    #: raise both together for longer handlers. ``0``: cancel them at once.
    drain_timeout: float = 20.0
    #: A ``run()`` handler still running after this many seconds is cancelled and its
    #: stream handed back with a retry counted (a failure). ``None``: no limit.
    handler_timeout: float | None = None
    #: A stream held longer than this (seconds) without being finished is reported once
    #: (a warning and the ``held_overdue`` gauge): an application task that died without
    #: ``done_stream`` or ``hand_back`` would otherwise keep it forever under a healthy
    #: heartbeat. ``None``: never.
    hold_warning: float | None = 600.0
    # -- plugins and the server -----------------------------------------------

    #: Entry-point plugins (group ``lbs``) not to load, by entry-point name, e.g.
    #: ``("prometheus",)``. Installed plugins are enabled unless named here.
    disabled_plugins: tuple[str, ...] = ()
    #: Add the keyspace-event flags recovery listens to (``Kx``) to the server's
    #: ``notify-keyspace-events`` at start, keeping everyone else's flags.
    configure_keyspace_events: bool = True

    # -- recovery of dead consumers' streams -------------------------------------
    #: Run recovery in this client (every client does by default; any number of
    #: recoverers re-queue an entry exactly once).
    recovery: bool = True
    #: Fast path 1: poll the deadline index at once when a lease's keyspace ``expired`` event
    #: arrives.
    keyspace_recovery: bool = True
    #: Fast path 2: the deadline index is polled at its earliest deadline, and assignments
    #: whose holder's deadline passed are re-queued (independent of when Redis
    #: expires keys). This is the shortest pause between two polls; an idle client polls
    #: only every ``max(0.5 s, lock_ttl / 4, 2 x this)`` (half the gap its stall test allows;
    #: 2.5 s by default), the keyspace listener waking it at once when a lease expires.
    deadline_poll_interval: float = 0.25
    #: Overdue entries looked at per deadline poll.
    deadline_batch: int = 500
    #: The backstop: a full XPENDING scan this often (with +-10 % jitter) and once at start.
    reconciliation_interval: float = 60.0
    #: Only entries pending at least this long are scanned. ``None``: 30 s, or
    #: 3 x ``lock_ttl`` if that is longer. Must exceed 2 x ``lock_ttl``.
    min_idle: float | None = None
    #: Pending entries per XPENDING page (one round trip checks the page's holders' leases).
    scan_batch: int = 50
    #: With each scan, consumers of the group with nothing pending that have not read for this
    #: long (seconds) are deleted from it (a consumer that closes cleanly leaves at once); ``0``
    #: never. With pod names as consumer ids, each deployment would otherwise add one for good.
    forget_consumers_after: float = 3600.0
    #: How often the client samples the service's backlog, pending and dead-letter
    #: lengths for its gauges (seconds); ``0`` turns the sampling off.
    metrics_interval: float = 5.0
    #: How often the keyspace listener PINGs its Pub/Sub connection; no PONG within
    #: two intervals means the connection is half-open and is replaced.
    pubsub_ping_interval: float = 5.0
    #: Write this consumer's journal: starts and stops, failures, dead letters, recoveries and
    #: tallies go to the capped stream ``{<service>-input}:events`` (:func:`lbs.events.read_events`),
    #: at most one pipelined round trip a second while something happens, nothing while idle.
    journal: bool = True
    #: How often the consumer adds its tally (counts since its last one; only non-zero ones), seconds.
    journal_interval: float = 10.0
    #: The journal's approximate cap (``XADD MAXLEN ~``), in events.
    journal_maxlen: int = 10_000

    # -- beside the Go reference client ------------------------------------------
    #: Run beside consumers of the Go reference client v0.4 on the same service: no
    #: recovery path (scan, deadline poller, keyspace, ``claim()``) re-queues an entry
    #: whose Go-style lock ``<stream><MUTEX_KEY_SEP><entry id>`` exists (a live Go
    #: holder). The heartbeat then keeps every held entry's pending idle time under
    #: 4 s (the Go client's shortest ``WithLBSIdleTime``), so a Go consumer's start-up
    #: XAUTOCLAIM cannot take live lbs work. Single Redis only, as the Go client is
    #: (its lock keys have no hash tag).
    go_compatible: bool = False

    # -- the service's rate limit, shared by the fleet ---------------------------
    #: Most assignments the whole fleet of the service takes a second (every consumer of the
    #: service must set the same). ``None``: no limit, and nothing is sent for it. Counted in
    #: fixed windows of ``rate_limit_window`` on the server's clock, each giving
    #: ``rate_limit x rate_limit_window`` (its burst; fractions carry over to the next windows),
    #: so over any span of T seconds the fleet takes at most ``rate_limit x T`` plus two windows'
    #: worth (and what a read's round trip lags behind its grant). Costs one more round trip per
    #: read (a ``MULTI`` on ``{<service>-input}:rate:<window>``). A consumer that finds its window
    #: given out reads nothing until the next one; what it holds runs on untouched. While Redis
    #: fails, the reader backs off as for any failed read. ``run_keyed()`` is not limited. A
    #: ``ShardedClient`` gives each of its N shards a N-th.
    rate_limit: float | None = None
    #: The rate limit's window (its resolution), seconds: between 0.01 and 3600.
    rate_limit_window: float = 1.0

    def __post_init__(self) -> None:
        if self.rate_limit is not None:
            hint = (
                " (e.g. 10/minute is rate_limit=10 / 60)"
                if isinstance(self.rate_limit, str)
                else ""
            )
            require_number(
                self.rate_limit,
                "Config.rate_limit must be a positive number of assignments a second across the "
                f"fleet, or None{hint}",
                above=True,
                finite=True,
            )
        require_number(
            self.rate_limit_window,
            "Config.rate_limit_window must be a number of seconds from 0.01 to 3600",
            low=0.01,
            finite=True,
        )
        if self.rate_limit_window > 3600:
            raise ConfigurationError(
                "Config.rate_limit_window must be a number of seconds from 0.01 to 3600, "
                f"got {self.rate_limit_window!r}"
            )

        def positive(name: str) -> None:
            v = getattr(self, name)
            require_number(v, f"Config.{name} must be a positive number", above=True, finite=True)

        def at_least(name: str, low: int) -> None:
            v = getattr(self, name)
            require_number(v, f"Config.{name} must be an integer >= {low}", integer=True, low=low)

        for name in ("lock_ttl", "read_block", "read_retry_initial", "read_retry_max"):
            positive(name)
        if self.lock_ttl < 0.01:
            raise ConfigurationError(
                f"Config.lock_ttl must be at least 0.01 s, got {self.lock_ttl!r}"
            )
        if self.heartbeat_interval is not None:
            positive("heartbeat_interval")
            if self.heartbeat_interval >= self.lock_ttl:
                raise ConfigurationError(
                    f"Config.heartbeat_interval ({self.heartbeat_interval}) must be shorter than "
                    f"lock_ttl ({self.lock_ttl}), or the lease expires between heartbeats"
                )
        if self.go_compatible and self.heartbeat_every >= GO_MIN_IDLE:
            raise ConfigurationError(
                f"Config.go_compatible needs a heartbeat under {GO_MIN_IDLE} s (the Go client's shortest "
                f"XAUTOCLAIM idle time), got heartbeat_interval {self.heartbeat_interval}"
            )
        if self.read_retry_max < self.read_retry_initial:
            raise ConfigurationError("Config.read_retry_max must be >= read_retry_initial")
        for name in (
            "deadline_poll_interval",
            "reconciliation_interval",
            "pubsub_ping_interval",
            "dead_letter_claim_idle",
            "journal_interval",
        ):
            positive(name)
        if self.min_idle is not None:
            positive("min_idle")
            if self.min_idle <= 2 * self.lock_ttl:
                raise ConfigurationError(
                    f"Config.min_idle ({self.min_idle}) must exceed twice lock_ttl ({self.lock_ttl}): "
                    "an entry pending for less may belong to a live holder between heartbeats"
                )
        if self.read_count is not None:
            at_least("read_count", 1)
        for name in (
            "max_streams",
            "heartbeat_chunk",
            "notification_buffer",
            "max_input_bytes",
            "scan_batch",
            "deadline_batch",
            "dead_letter_batch",
            "journal_maxlen",
        ):
            at_least(name, 1)
        at_least("read_max_retries", -1)
        at_least("max_retries", -1)
        if self.hold_warning is not None:
            positive("hold_warning")
        if self.handler_timeout is not None:
            positive("handler_timeout")
        for name in (
            "retry_delay",
            "retry_delay_max",
            "metrics_interval",
            "forget_consumers_after",
        ):
            require_number(getattr(self, name), f"Config.{name} must be a number >= 0", finite=True)
        if self.retry_delay_max < self.retry_delay:
            raise ConfigurationError("Config.retry_delay_max must be >= retry_delay")
        require_number(self.drain_timeout, "Config.drain_timeout must be >= 0")
        for name in (
            "configure_keyspace_events",
            "recovery",
            "keyspace_recovery",
            "fair_dispatch",
            "journal",
        ):
            if not isinstance(getattr(self, name), bool):  # "false" would be true
                raise ConfigurationError(
                    f"Config.{name} must be True or False, got {getattr(self, name)!r}"
                )
        if not isinstance(self.field_prefix, str) or not self.field_prefix:
            raise ConfigurationError("Config.field_prefix must be a non-empty str")
        if (
            isinstance(self.disabled_plugins, str)
            or not isinstance(self.disabled_plugins, Iterable)
            or not all(isinstance(n, str) for n in self.disabled_plugins)
        ):
            raise ConfigurationError(
                "Config.disabled_plugins must be a sequence of entry-point names (str), "
                f"got {self.disabled_plugins!r}"
            )
        object.__setattr__(self, "disabled_plugins", tuple(self.disabled_plugins))
        if self.dead_letter_stream is not None and not isinstance(self.dead_letter_stream, str):
            raise ConfigurationError("Config.dead_letter_stream must be a str or None")

    @property
    def heartbeat_every(self) -> float:
        """The effective heartbeat interval in seconds (with :attr:`go_compatible`, at most 2 s)."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return min(self.lock_ttl / 3, GO_MIN_IDLE / 2) if self.go_compatible else self.lock_ttl / 3

    @property
    def scan_min_idle(self) -> float:
        """The effective ``min_idle`` in seconds."""
        return self.min_idle if self.min_idle is not None else max(30.0, 3 * self.lock_ttl)

    @property
    def pel_refresh_every(self) -> int:
        """No longer used by lbs since the consumer lease (the retired lbs-claim plugin still reads
        it): a held entry's pending idle time does not matter, since the entry is held while its
        consumer's lease lives, and the heartbeat no longer refreshes it (beside a Go fleet every
        tick refreshes every held entry).

        It was the number of heartbeat ticks between two refreshes of one entry's idle time, when
        each tick extended every lock but refreshed a rotating 1/N of the entries, N chosen so
        that a live entry's idle time stayed under half of :attr:`scan_min_idle`.
        """
        keep_under = (
            min(self.scan_min_idle, GO_MIN_IDLE) if self.go_compatible else self.scan_min_idle
        )
        return max(1, int((keep_under / 2) // self.heartbeat_every))

    @property
    def lock_ttl_ms(self) -> int:
        return max(1, int(self.lock_ttl * 1000))

    @property
    def fair_window_ms(self) -> int | None:
        """Fair dispatch's window (ms): peers idle less than this are live; None when it is off."""
        return int(max(5.0, 3 * self.read_block) * 1000) if self.fair_dispatch else None

    def replace(self, **changes: object) -> Config:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap the dataclass ``__init__`` so a typo or a positional argument is a ConfigurationError.

    The generated ``__init__`` would raise a bare TypeError. Set after the
    class is built, so it stays a frozen ``kw_only`` dataclass (type checkers
    keep its generated signature) and :meth:`Config.replace` goes through it.
    """
    names = [f.name for f in dataclasses.fields(Config)]

    @functools.wraps(init)
    def __init__(self: Config, *args: Any, **kwargs: Any) -> None:
        if args:
            raise ConfigurationError(
                f"Config takes keyword arguments only (e.g. Config(lock_ttl=10.0)), got {len(args)} "
                f"positional: {', '.join(repr(a) for a in args)}"
            )
        for key in kwargs:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigurationError(f"Config has no field {key!r}{hint}")
        init(self, **kwargs)

    return __init__


setattr(Config, "__init__", _checked_init(Config.__init__))  # noqa: B010 (mypy refuses assigning a method)
