"""Hook specifications: how plugins observe and extend an :class:`lbs.Client`.

Implement hooks in any object or module decorated with :data:`lbs.hookimpl` and pass it to
``lbs.Client(..., plugins=[...])``, or publish it under the entry-point group ``lbs``. An
implementation may accept any subset of a hook's arguments. Hooks are called synchronously on the
client's event loop thread, so keep them quick. An exception in a notification hook is logged and
never breaks the client; one raised by a provider hook (``firstresult``) or by
``lbs_config_defaults`` reaches the application from the call that asked (the constructor,
``start()`` or ``run()``).

Notification hooks are 1:N: every implementation is called, each on its own (one that raises is
logged with its plugin's name and the others still run), results ignored. Hooks marked
``firstresult`` ask a question: the first implementation that returns something other than None
decides.

Per-assignment events come two ways: batched (:func:`lbs_streams_started`,
:func:`lbs_locks_released`: one call per read or finish batch) and per event
(:func:`lbs_lock_acquired`, :func:`lbs_stream_started`, :func:`lbs_lock_released`: a pluggy call
per stream). Prefer the batched ones; a hook nobody implements costs nothing. Counts need no hook:
:attr:`lbs.Client.stats` and :attr:`lbs.Client.metrics` can be read when wanted
(``lbs-prometheus`` reads them at scrape time).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from . import metrics as _metrics

if TYPE_CHECKING:
    from ._redis.routes import Sender
    from .client import Client, Handler, Held
    from .deadletters import DeadLetterBackend
    from .keyed import KeyedHandler
    from .notifications import DoneStatus, Notification
    from .strategy import ReadStrategy

#: The project name: marker name and entry-point group.
NAME = "lbs"

hookspec = pluggy.HookspecMarker(NAME)
#: Marks a function or method as a hook implementation: ``@lbs.hookimpl`` (pluggy's options too,
#: ``@lbs.hookimpl(trylast=True)``).
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


# ----------------------------------------------- taken, extended, finished ---


@hookspec
def lbs_lock_acquired(client: Client, stream: str, entry_id: str, token: int) -> None:
    """Called when the reader took an assignment (held under the consumer's lease), before
    STREAM_ADDED (per event: one call per stream; :func:`lbs_streams_started` is the batched form,
    and cheaper). The name stays from the lock per entry, which the lease replaced.

    :param client: the client.
    :param stream: the data stream's name.
    :param entry_id: the LBS entry id.
    :param token: the fencing token of the read that took it, shared by its batch.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_locks_extended(client: Client, extended: int, lost: int, seconds: float) -> None:
    """Called after each heartbeat tick that went through while at least one
    stream was held (once per tick: the tick extends the consumer's one
    lease, however many streams it holds).

    :param client: the client.
    :param extended: the streams held at the tick, less ``lost``.
    :param lost: the streams lost with the lease: all of them when the tick
        found it lapsed, else 0; each also gets :func:`lbs_stream_disowned`.
    :param seconds: how long the tick's round trip took.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_lock_released(
    client: Client, stream: str, entry_id: str, token: int, status: DoneStatus
) -> None:
    """Called when :meth:`lbs.Client.done_stream` or :meth:`lbs.Client.done_streams`, or a
    :meth:`lbs.Client.run` handler that returned, finished an assignment (per event: one call per
    stream; :func:`lbs_locks_released` is the batched form, and cheaper).

    :param client: the client.
    :param stream: the data stream's name.
    :param entry_id: the LBS entry id.
    :param token: the stream's fencing token.
    :param status: what finishing found: ``DONE``, or ``LOCK_LOST`` (the lease it was read under
        had lapsed, or the entry was handed on).

    .. versionadded:: 0.1
    """


@hookspec
def lbs_locks_released(client: Client, released: Sequence[tuple[Held, DoneStatus]]) -> None:
    """Called once per batch of finished assignments, with each one's outcome: once per
    :meth:`lbs.Client.done_stream` or :meth:`lbs.Client.done_streams` call, and once per
    ``done-n.lua`` batch for :meth:`lbs.Client.run` handlers that returned (however many streams
    finished together). The batched form of :func:`lbs_lock_released`; prefer it. Called only
    when some plugin implements it.

    :param client: the client.
    :param released: ``(held, status)`` per finished assignment, in order: the :class:`lbs.Held`
        record (``stream``, ``entry_id``, ``token``, ``retry_count``, ...) and what finishing
        found, ``DONE`` or ``LOCK_LOST`` (the lease it was read under had lapsed, or the entry
        was handed on).

    .. versionadded:: 0.1
    """


# ----------------------------------------------------------------- metrics ---


@hookspec
def lbs_metric(
    client: Client, name: str, kind: str, value: float, labels: Mapping[str, str]
) -> None:
    """Called for every metric event, on the client's event loop (none is per assignment). An
    exporter need not implement it for lbs's names: :attr:`lbs.Client.metrics` keeps every event's
    value, by name and (in ``.series``) by labels, to be read when asked; other plugins may report
    their own names through this hook.

    The names lbs emits are stable (a metrics plugin may map them 1:1): they are the entries of
    :data:`lbs.metrics.METRICS`, which gives each one's kind, help text and labels beyond
    ``service`` and ``consumer``. Treat a name not in the table (another plugin's) as a new
    metric, not an error. The table, as of this version:

    <lbs.metrics.METRICS>

    :param client: the client.
    :param name: the metric's name.
    :param kind: ``"counter"`` (``value`` is an increment), ``"gauge"`` (the new
        value) or ``"histogram"`` (one observation); for a name in the table,
        its :attr:`lbs.metrics.Metric.kind`.
    :param value: see ``kind``.
    :param labels: ``service`` and ``consumer`` always, plus the metric's own
        (:attr:`lbs.metrics.Metric.labels`).

    .. versionadded:: 0.1
    """


# The table goes into the docstring here, so it is never written out twice
# (pluggy reads only the signature and the marker, not the docstring).
# ``python -OO`` strips docstrings: then there is nothing to fill in. Python 3.13
# strips their common indentation when compiling: the table takes the placeholder's.
if lbs_metric.__doc__ is not None:
    lbs_metric.__doc__ = re.sub(
        r"^([ \t]*)<lbs\.metrics\.METRICS>\n",
        lambda m: textwrap.indent(_metrics.render_rst(), m[1]),
        lbs_metric.__doc__,
        count=1,
        flags=re.M,
    )


# ----------------------------------------------------------------- streams ---


@hookspec
def lbs_stream_started(client: Client, notification: Notification) -> None:
    """Called when a STREAM_ADDED notification is about to be delivered (per
    event: one call per stream; :func:`lbs_streams_started` is the batched
    form, and cheaper).

    :param client: the client.
    :param notification: the notification.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_streams_started(client: Client, notifications: Sequence[Notification]) -> None:
    """Called once per read batch that took streams, after their STREAM_ADDED notifications were
    handed out (to :meth:`lbs.Client.run`'s handlers or the notification buffer).

    The batched form of :func:`lbs_lock_acquired` and :func:`lbs_stream_started` (each notification
    carries the stream, the entry id and its fencing token); prefer it. Called only when some plugin
    implements it. When the notification buffer was full, the application may already have
    finished some of the batch's streams by then.

    :param client: the client.
    :param notifications: the batch's STREAM_ADDED notifications, in order.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_disowned(client: Client, stream: str, entry_id: str, token: int) -> None:
    """Called when this client lost a held stream, before STREAM_DISOWNED is sent: the heartbeat
    found the consumer's lease lapsed (or no tick confirmed it for a lease TTL), or, beside a Go
    fleet, a Go consumer took the stream.

    :param client: the client.
    :param stream: the data stream's name.
    :param entry_id: the LBS entry id.
    :param token: the stream's fencing token.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_handed_back(
    client: Client, stream: str, entry_id: str, new_entry_id: str, retry_counted: bool
) -> None:
    """Called when a held stream went back to the LBS as a fresh entry: by
    :meth:`lbs.Client.hand_back` (``retry_counted`` as asked), on ``close()`` or a signal under
    ``run()`` (False), or after a ``run()`` handler raised or was cancelled from outside (True).
    Not called when the hand-back dead-lettered the stream instead (:func:`lbs_stream_dead_lettered`).

    :param client: the client.
    :param stream: the data stream's name.
    :param entry_id: the LBS entry id it had.
    :param new_entry_id: the fresh entry's id in the LBS, or, when the stream was parked
        for its retry back-off, its id in ``{<service>-input}:delayed``.
    :param retry_counted: whether the stream's retry count went up.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_dead_lettered(
    client: Client, entry_id: str, reason: str, dead_letter_id: str
) -> None:
    """Called when an entry went to the dead-letter stream (malformed, or out of retries).

    :param client: the client.
    :param entry_id: the LBS entry id.
    :param reason: why it was dead-lettered.
    :param dead_letter_id: its id in the dead-letter stream; empty when dead
        letters are dropped (``Config.dead_letter_stream = ""``).

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

    .. versionadded:: 0.1
    """


@hookspec
def lbs_worker_banner(client: Client) -> Mapping[str, str] | None:
    """Rows for ``lbs worker``'s start banner: what a plugin serves, e.g.
    ``{"metrics": "http://127.0.0.1:9100/metrics and /healthz"}``.

    Called once, by the worker process that prints the banner, after its
    client started (in ``--processes N``, the one in slot 0: describe every
    process, see :func:`lbs.plugins.worker_slot`). Return None for nothing.
    A plugin that raises is logged and left out of the banner.

    :param client: the worker's started client.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_process_info(client: Client) -> Mapping[str, str] | None:
    """What this process tells the journal about itself, e.g. where it serves its metrics:
    ``{"metrics": "http://10.0.0.7:9100/metrics"}`` (``lbs dashboard`` links and reads that one).

    Called once per client, after :func:`lbs_client_started`; the answers (str to str, merged, a
    later one winning) go into the journal's ``started`` event (:mod:`lbs.events`). Not called with
    ``Config.journal`` off. A plugin that raises is logged and left out.

    :param client: the started client.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def lbs_handler(client: Client) -> Handler | None:
    """Provide the handler :meth:`lbs.Client.run` calls when it is given none.

    Called once, when ``run()`` starts without a handler, on the client's
    event loop. Return an ``async def handler(notification)`` (see
    :meth:`lbs.Client.run`) or None to let another plugin answer. With no
    answer ``run()`` raises :class:`lbs.ConfigurationError`.

    :param client: the client about to run.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def lbs_reader(client: Client, server_version: tuple[int, ...]) -> ReadStrategy | None:
    """Choose how the client reads new work: a :class:`lbs.ReadStrategy`.

    Called once in :meth:`lbs.Client.start`, after the server's version is
    known (``()`` when it could not be read), before the reader starts. The
    built-in plugin ``lbs-default-reader`` answers last (new entries only).
    Raise :class:`lbs.ConfigurationError` to refuse to start (say, a server
    too old for the strategy); ``start()`` raises it to the application.
    First non-None wins.

    :param client: the client starting.
    :param server_version: the Redis version the server answers as, ``()`` when unknown (Valkey 9.1
        answers ``(7, 2, 4)``; ``client.server_name`` says what it is, for a log line).

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def lbs_dead_letter_backend(client: Client) -> DeadLetterBackend | None:
    """Provide where dead letters are forwarded after the dead-letter stream.

    Called once in :meth:`lbs.Client.start`, right after
    :func:`lbs_reader`, and only when dead letters are kept
    (``Config.dead_letter_stream`` not empty). Return an object with a
    ``name`` and an ``async write(letters)`` (:class:`lbs.DeadLetterBackend`)
    that returns once the letters are durably written and raises otherwise,
    or None to let another plugin answer. With a backend the client runs a
    forwarder that deletes each letter from the stream only after ``write``
    returned (at-least-once: key on :attr:`lbs.DeadLetter.id` to drop
    repeats). Without one, dead letters stay in the stream. First non-None
    wins.

    :param client: the client starting.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_stream_expired(
    client: Client, stream: str, entry_id: str, new_entry_id: str, retry_count: int, path: str
) -> None:
    """Called when this client's recovery put a stream back into circulation.

    The stream's holder lost its lease (it died, stalled or was evicted); the
    entry was re-queued as ``new_entry_id`` with ``retry_count`` failed
    attempts. ``stream`` is ``""`` when the entry's ``lbs-input`` could not
    be decoded. ``path`` says who found it: ``deadline``, ``keyspace``,
    ``scan``, ``startup``, ``claim`` or ``heartbeat`` (what this client
    lost with its own lease). Called before STREAM_EXPIRED is sent.

    :param client: the client whose recovery did it.
    :param stream: the data stream's name, or ``""``.
    :param entry_id: the LBS entry id the stream had.
    :param new_entry_id: the fresh entry's id.
    :param retry_count: failed attempts so far.
    :param path: which recovery path found it (see above).

    .. versionadded:: 0.1
    """


# ------------------------------------------------------ messages, handlers ---


@hookspec
def lbs_message_fields(sender: Sender, service: str) -> Mapping[str, str] | None:
    """Fields to add to every entry of one send, e.g. the W3C trace context (``traceparent``).

    Called once per :meth:`lbs.Producer.add_stream`, ``add_streams``, :meth:`lbs.Publisher.publish`
    or ``publish_many`` call (not per entry), before anything is sent, when some plugin of the
    sender implements it (a sender loads plugins as a client does, and takes ``plugins=``). The
    fields go beside ``lbs-input`` in every LBS entry (the Go client reads only that) or into
    every published message. A later answer wins for one name; lbs's own names (``lbs-input``,
    ``lbs-keyed``, ``_``-prefixed), text UTF-8 cannot encode (a lone surrogate) and a plugin that
    raises are logged and left out. Consumers read them from :attr:`lbs.Held.fields`; re-queued
    copies keep them.

    :param sender: the :class:`lbs.Producer` or :class:`lbs.Publisher`.
    :param service: its service.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_wrap_handler(client: Client, handler: Handler) -> Handler | None:
    """Wrap the handler :meth:`lbs.Client.run` calls (a span, a timer); free when unused.

    Called once when ``run()`` starts, after the handler is known. Each implementation gets the
    previous one's answer, in pluggy's order (the plugin asked last wraps outermost); return an
    ``async def`` taking the notification that returns what ``handler`` returns and raises what
    it raises, or None. Meanwhile :meth:`lbs.Client.find_held` gives the stream's
    :class:`lbs.Held`. An implementation that raises fails ``run()``.

    :param client: the client about to run.
    :param handler: the handler so far.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_wrap_keyed_handler(client: Client, handler: KeyedHandler) -> KeyedHandler | None:
    """Wrap the handler :meth:`lbs.Client.run_keyed` calls with each :class:`lbs.KeyedBatch`.

    Called once when ``run_keyed()`` starts, as :func:`lbs_wrap_handler` is for ``run()``: each
    implementation gets the previous one's answer; return an ``async def`` taking the batch that
    returns what ``handler`` returns and raises what it raises, or None. An implementation that
    raises fails ``run_keyed()``.

    :param client: the client about to run.
    :param handler: the handler so far.

    .. versionadded:: 0.1
    """


@hookspec
def lbs_hand_back_fields(
    client: Client, held: Held, retry_counted: bool
) -> Mapping[str, str] | None:
    """Fields to set on the copy of a stream handed back (the failed attempt's span, say).

    Called per stream, just before ``requeue-6.lua``, when a ``run()`` handler failed, timed out
    or was cancelled, by :meth:`lbs.Client.hand_back` and on ``close()``; not for recovery after
    a death. The fields replace the entry's own of the same names on the copy (re-queued, parked
    or dead-lettered); names and failures are treated as for :func:`lbs_message_fields`.

    :param client: the client handing back.
    :param held: the stream's record.
    :param retry_counted: whether a retry is counted.

    .. versionadded:: 0.1
    """


#: Every hook (the ``lbs_*`` functions above), and the markers: computed, so a new hook is never
#: left out (tests/unit/test_hookspecs.py checks the list; the linter cannot read it, hence noqa).
__all__ = ["NAME", "hookimpl", "hookspec", *sorted(n for n in dir() if n.startswith("lbs_"))]  # noqa: PLE0604
