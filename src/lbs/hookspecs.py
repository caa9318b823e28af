"""Hook specifications: how plugins observe and extend an :class:`lbs.Client`.

Implement hooks in any object or module decorated with :data:`lbs.hookimpl`
and pass it to ``lbs.Client(..., plugins=[...])``, or publish it under the
entry-point group ``lbs``. An implementation may accept any subset of a
hook's arguments. Hooks are called synchronously on the client's event loop
thread, so keep them quick. An exception in a notification hook is logged
and never breaks the client; one raised by a provider hook (``firstresult``)
or by ``lbs_config_defaults`` reaches the application from the call that
asked (the constructor, ``start()`` or ``run()``).

Notification hooks are 1:N: every implementation is called, each on its
own (one that raises is logged with its plugin's name and the others still
run), results ignored. Hooks marked ``firstresult`` ask a question: the
first implementation that returns something other than None decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .client import Client, Handler
    from .deadletters import DeadLetterBackend
    from .reading import ReadStrategy
    from .notifications import DoneStatus, Notification

#: The project name: marker name and entry-point group.
NAME = "lbs"

hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)


# --------------------------------------------------------------- lifecycle ---

@hookspec
def lbs_client_started(client: Client) -> None:
    """Called once when :meth:`lbs.Client.start` has created the group and
    started the reader and the heartbeat.

    :param client: the client.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_client_closed(client: Client, handed_back: int) -> None:
    """Called once at the end of :meth:`lbs.Client.close`.

    :param client: the client.
    :param handed_back: how many held streams were handed back to the LBS.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_reader_terminated(client: Client, error: BaseException) -> None:
    """Called when the reader gives up after ``Config.read_max_retries``
    failed reads in a row, just before STREAM_TERMINATED is sent.

    :param client: the client.
    :param error: the last error.

    .. versionadded:: 0.1
    """


# ------------------------------------------------------------------- locks ---

@hookspec
def lbs_lock_acquired(client: Client, stream: str, entry_id: str, token: int) -> None:
    """Called when the reader took an assignment's lock, before STREAM_ADDED.

    :param client: the client.
    :param stream: the data stream's name.
    :param entry_id: the LBS entry id.
    :param token: the lock's fencing token.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_locks_extended(client: Client, extended: int, lost: int, seconds: float) -> None:
    """Called after each heartbeat tick (one per tick, not per lock).

    :param client: the client.
    :param extended: locks extended (pending idle times are refreshed for a
        rotating share of them, see ``Config.pel_refresh_every``).
    :param lost: locks found no longer ours; each also gets
        :func:`lbs_stream_disowned`.
    :param seconds: how long the tick's round trip took.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_lock_released(client: Client, stream: str, entry_id: str, token: int, status: DoneStatus) -> None:
    """Called when :meth:`lbs.Client.done_stream` finished an assignment.

    :param client: the client.
    :param stream: the data stream's name.
    :param entry_id: the LBS entry id.
    :param token: the fencing token the lock had.
    :param status: what ``done_stream`` found (``DONE`` or a lost lock).

    .. versionadded:: 0.1
    """


# ----------------------------------------------------------------- metrics ---

@hookspec
def lbs_metric(client: Client, name: str, kind: str, value: float, labels: Mapping[str, str]) -> None:
    """Called for every metric event, on the client's event loop.

    Names are stable (a metrics plugin maps them 1:1): ``recovery_keyspace_requeued_total``,
    ``recovery_deadline_requeued_total``, ``recovery_scan_requeued_total``,
    ``recovery_startup_requeued_total``, ``recovery_claim_requeued_total``,
    ``recovery_heartbeat_requeued_total``, ``dead_letters_forwarded_total``,
    ``dead_letters_forward_failures_total`` (label ``backend``), ``read_failures_total``,
    ``heartbeat_failures_total``, ``done_failures_total`` (streams whose finishing failed),
    ``hand_back_failures_total``,
    ``recovery_scan_skipped_alive_total``, ``recovery_duplicate_ack_total``,
    ``recovery_trimmed_total``, ``recovery_dlq_total``, ``recovery_scan_duration_seconds``,
    ``recovery_expiry_lag_seconds``, ``pel_depth``, ``startup_recovery_requeued_total``,
    ``startup_recovery_duration_seconds``, ``startup_recovery_success``,
    ``keyspace_listener_reconnects_total``, ``keyspace_listener_gap_seconds``,
    ``topology_changes_total``, ``server_restarts_total`` (the server's run id changed;
    keyspace events set again), ``duplicate_consumer_total`` (a heartbeat found another
    live process with this consumer id), ``wrong_type_keys_total`` (a script refused a
    key of the wrong type), ``held_overdue`` (gauge: streams held longer than
    ``Config.hold_warning``).

    :param client: the client.
    :param name: the metric's name.
    :param kind: ``"counter"`` (``value`` is an increment), ``"gauge"`` (the new
        value) or ``"histogram"`` (one observation).
    :param value: see ``kind``.
    :param labels: extra dimensions (``service`` and ``consumer`` are always there).

    .. versionadded:: 0.1
    """


# ----------------------------------------------------------------- streams ---

@hookspec
def lbs_stream_started(client: Client, notification: Notification) -> None:
    """Called when a STREAM_ADDED notification is about to be delivered.

    :param client: the client.
    :param notification: the notification.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_disowned(client: Client, stream: str, entry_id: str, token: int) -> None:
    """Called when the heartbeat found a held lock no longer ours, before
    STREAM_DISOWNED is sent.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_handed_back(client: Client, stream: str, entry_id: str, new_entry_id: str, retry_counted: bool) -> None:
    """Called when a held stream went back to the LBS as a fresh entry: by
    :meth:`lbs.Client.hand_back` (``retry_counted`` as asked), on ``close()``
    or a signal under ``run()`` (False), or after a ``run()`` handler raised
    or was cancelled from outside (True).

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_dead_lettered(client: Client, entry_id: str, reason: str, dead_letter_id: str) -> None:
    """Called when an entry went to the dead-letter stream (malformed, or out
    of retries). ``dead_letter_id`` is empty when dead letters are dropped
    (``Config.dead_letter_stream = ""``).

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------- providers ---

@hookspec
def lbs_config_defaults() -> Mapping[str, Any] | None:
    """Contribute defaults for :class:`lbs.Config` fields.

    Called once per client, in its constructor, and only when the
    application passes no ``config`` (an explicit Config is used as given).
    Return a mapping of field names to values, or None. Two plugins giving
    one field different values, or an unknown field (or
    ``disabled_plugins``), fail the constructor with
    :class:`lbs.ConfigurationError` naming the plugins.

    .. versionadded:: 0.2
    """


@hookspec(firstresult=True)
def lbs_handler(client: Client) -> Handler | None:
    """Provide the handler :meth:`lbs.Client.run` calls when it is given none.

    Called once, when ``run()`` starts without a handler, on the client's
    event loop. Return an ``async def handler(notification)`` (see
    :meth:`lbs.Client.run`) or None to let another plugin answer. With no
    answer ``run()`` raises :class:`lbs.ConfigurationError`.

    :param client: the client about to run.

    .. versionadded:: 0.2
    """


@hookspec(firstresult=True)
def lbs_reader(client: Client, server_version: tuple[int, ...]) -> ReadStrategy | None:
    """Choose how the client reads new work: a :class:`lbs.ReadStrategy`.

    Called once in :meth:`lbs.Client.start`, after the server's version is
    known (``()`` when it could not be read), before the reader starts. The
    built-in plugin ``lbs-default-reader`` answers last (new entries only).
    Raise :class:`lbs.ConfigurationError` to refuse to start (say, a server
    too old for the strategy); ``start()`` raises it to the application.

    .. versionadded:: 0.2
    """


@hookspec(firstresult=True)
def lbs_dead_letter_backend(client: Client) -> DeadLetterBackend | None:
    """Provide where dead letters are forwarded after the dead-letter stream.

    Called once in :meth:`lbs.Client.start`. Return an object with a
    ``name`` and an ``async write(letters)`` (:class:`lbs.DeadLetterBackend`)
    that returns once the letters are durably written and raises otherwise,
    or None to let another plugin answer. With a backend the client runs a
    forwarder that deletes each letter from the stream only after ``write``
    returned (at-least-once: key on :attr:`lbs.DeadLetter.id` to drop
    repeats). Without one, dead letters stay in the stream.

    .. versionadded:: 0.2
    """


@hookspec
def lbs_stream_expired(client: Client, stream: str, entry_id: str, new_entry_id: str, retry_count: int,
                       path: str) -> None:
    """Called when this client's recovery put a stream back into circulation.

    The stream's holder lost its lock (it died, stalled or was evicted); the
    entry was re-queued as ``new_entry_id`` with ``retry_count`` failed
    attempts. ``stream`` is ``""`` when the entry's ``lbs-input`` could not
    be decoded. ``path`` says who found it: ``deadline``, ``keyspace``,
    ``scan``, ``startup``, ``claim`` or ``heartbeat`` (this client's own
    lost lock). Called before STREAM_EXPIRED is sent.

    .. versionadded:: 0.2
    """


__all__ = ["NAME", "hookimpl", "hookspec",
    "lbs_config_defaults",
    "lbs_handler",
    "lbs_reader",
    "lbs_dead_letter_backend",
    "lbs_stream_expired",
    "lbs_client_started",
    "lbs_client_closed",
    "lbs_reader_terminated",
    "lbs_lock_acquired",
    "lbs_locks_extended",
    "lbs_metric",
    "lbs_lock_released",
    "lbs_stream_started",
    "lbs_stream_disowned",
    "lbs_stream_handed_back",
    "lbs_stream_dead_lettered",
]
