"""``lbs status SERVICE`` (one screen of a service's state, ``--watch`` to keep it live) and
``lbs claim SERVICE ENTRY_ID...`` (re-queue assignments whose lock is gone, now).

Both are plain typer command functions; the ``lbs`` app registers them
(``app.command("status")(status)``). Exit codes (shared with ``lbs dlq``):

* 0: done as asked (``status``: the service exists; ``claim``: every id was
  re-queued, dead-lettered, or needed nothing: not pending);
* 1: a failure: Redis unreachable or refusing (a key of the wrong type, an
  ACL), or no such service (``status``: its load-balancer stream does not
  exist; ``--json`` still prints the document, with ``"exists": false``);
* 2: the command line is wrong;
* 3: done in part (``claim``: some assignment is still locked by a live
  holder, or could not be claimed; ``dlq``: letters refused, not found, or a
  purge not confirmed);
* 78: a setting is invalid (a Redis URL redis-py cannot use).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import redis.asyncio as aioredis
import typer
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .. import _keys
from .._redis.connection import resolve_client, slot_owner
from .._redis.wire import text as reply_text
from ..client import Client
from ..config import Config
from ..exceptions import ConfigurationError, LbsError
from ..hookspecs import hookimpl
from ..status import ConsumerStatus, ServiceStatus, collect_status
from ._common import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    err_console,
    explain,
    fail,
    mask_url,
)

__all__ = [
    "EXIT_INCOMPLETE",
    "ServiceArgument",
    "UrlOption",
    "check_service",
    "claim",
    "duration",
    "owner",
    "render_status",
    "run",
    "status",
]

#: The command ran but did not do all it was asked: a stream still locked, a letter refused or missing.
EXIT_INCOMPLETE = 3

#: ``--url``: every command that reads a service takes it, defaulting to ``$LBS_URL``.
UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="LBS_URL",
        show_envvar=True,
        help="Redis URL: redis://, rediss://, redis+cluster:// (any node of a cluster) or rediss+cluster://.",
    ),
]
ServiceArgument = Annotated[
    str,
    typer.Argument(
        metavar="SERVICE",
        help="The service: its load-balancer stream is `SERVICE-input`.",
        show_default=False,
    ),
]

T = TypeVar("T")


def run(command: str, work: Callable[[], Coroutine[Any, Any, T]], url: str = "") -> T:
    """Run ``work()`` to its end; lbs and Redis errors become a message on stderr and an exit code.

    A bad setting (a URL redis-py cannot use, a service name with braces)
    exits 78, any other lbs or Redis error 1 (with the fix, for a password
    or TLS mistake in ``url``). Ctrl-C is not caught here.
    """
    try:
        return asyncio.run(work())
    except ConfigurationError as exc:
        fail(command, str(exc), EXIT_CONFIG)
    except (LbsError, RedisError, OSError) as exc:
        fail(command, explain(exc, url), EXIT_FAILURE)


# ------------------------------------------------------------------- status ---


def status(
    service: ServiceArgument,
    url: UrlOption,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Redraw every --interval seconds until Ctrl-C (exit code 0). With --json: one "
            "document per line.",
        ),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            "-n",
            min=0.1,
            metavar="SECONDS",
            help="Seconds between two reads with --watch.",
        ),
    ] = 2.0,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON document (`ServiceStatus.to_dict()`: ages and deadlines in ms of the "
            "server's clock) instead of the screen.",
        ),
    ] = False,
    letters: Annotated[
        int,
        typer.Option(
            min=0, metavar="N", help="Count the dead-letter reasons over the newest N letters."
        ),
    ] = 100,
) -> None:
    """Show a service's state: backlog, pending, consumers (alive, late, dead, departed), dead letters.

    Two round trips to the master that owns the service; every age and
    deadline is the server's clock against itself. Exit code 0 when the
    service exists, 1 when it does not (no `SERVICE-input`) or Redis fails.
    """
    check_service("status", service)
    if watch:
        try:
            run("status", lambda: _watch(url, service, interval, json_out, letters), url)
        except KeyboardInterrupt:
            pass
        raise typer.Exit(EXIT_OK)
    st = run("status", lambda: collect_status(url, service, letters=letters), url)
    if json_out:
        sys.stdout.write(json.dumps(st.to_dict()) + "\n")
    else:
        Console().print(render_status(st, url=mask_url(url)))
    if not st.exists:
        if json_out:
            err_console.print(
                f"lbs status: no service {service!r}: {st.stream} does not exist",
                markup=False,
                highlight=False,
            )
        raise typer.Exit(EXIT_FAILURE)


def check_service(command: str, service: str) -> None:
    """Exit 2 (usage), naming the problem, unless ``service`` can name a service."""
    try:
        _keys.validate_service(service)
    except ConfigurationError as exc:
        fail(command, str(exc), EXIT_USAGE)


async def _watch(url: str, service: str, interval: float, json_out: bool, letters: int) -> None:
    from rich.live import Live

    client, owned = resolve_client(url)
    console = Console()
    try:
        if json_out:
            while True:
                st = await _read_or_error(client, service, letters)
                if isinstance(st, ServiceStatus):
                    sys.stdout.write(json.dumps(st.to_dict()) + "\n")
                    sys.stdout.flush()
                else:
                    err_console.print(f"lbs status: {st}", markup=False, highlight=False)
                await asyncio.sleep(interval)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                st = await _read_or_error(client, service, letters)
                rows = max(3, console.size.height - 20)
                if isinstance(st, ServiceStatus):
                    screen = render_status(
                        st,
                        url=mask_url(url),
                        max_rows=rows,
                        footer=f"every {interval:g} s, Ctrl-C to stop",
                    )
                else:
                    screen = Panel(
                        Text(st, style="red"),
                        title=f"lbs status {service}: cannot read",
                        subtitle=time.strftime("%H:%M:%S"),
                    )
                live.update(screen, refresh=True)
                await asyncio.sleep(interval)
    finally:
        if owned:
            await client.aclose()


async def _read_or_error(
    client: aioredis.Redis | RedisCluster, service: str, letters: int
) -> ServiceStatus | str:
    """A status, or what kept it from being read (the watch goes on: Redis may come back)."""
    try:
        return await collect_status(client, service, letters=letters)
    except (LbsError, RedisError, OSError) as exc:
        return str(exc)


# ---------------------------------------------------------------- rendering ---

_STATE_STYLE = {"alive": "green", "late": "yellow", "dead": "bold red", "departed": "dim"}


def duration(ms: int | None, signed: bool = False) -> str:
    """A duration for people: ``850 ms``, ``12.3 s``, ``4 min``, ``2.5 h``, ``3.1 d``; ``-`` for None."""
    if ms is None:
        return "-"
    sign = ("+" if ms >= 0 else "-") if signed else ("-" if ms < 0 else "")
    a = abs(ms)
    if a < 1000:
        text = f"{a} ms"
    elif a < 60_000:
        text = f"{a / 1000:.1f} s"
    elif a < 3_600_000:
        text = f"{a / 60_000:.0f} min"
    elif a < 86_400_000:
        text = f"{a / 3_600_000:.1f} h"
    else:
        text = f"{a / 86_400_000:.1f} d"
    return sign + text


def _server_clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def render_status(
    st: ServiceStatus, *, url: str = "", max_rows: int = 20, footer: str = ""
) -> RenderableType:
    """The status as one screen: a summary panel, the consumers (at most ``max_rows``, the departed
    counted, not listed), the dead-letter reasons (the five most frequent)."""
    where = f"{st.stream} · {st.server_name} {st.server_version or '?'}" + (
        f" · {st.node}" if st.node else ""
    )
    title = f"[bold]lbs status {st.service}[/] · {where}"
    subtitle = f"server time {_server_clock(st.time_ms)}" + (f" · {footer}" if footer else "")
    if not st.exists:
        body = Text(
            f"No such service: {st.stream} does not exist" + (f" on {url}" if url else "") + ".",
            style="bold red",
        )
        if st.dead_letters:
            body.append(
                f"\n{st.dead_letters:,} dead letters remain in {st.dead_letter_stream}.", style=""
            )
        return Panel(
            body, title=title, subtitle=subtitle, title_align="left", subtitle_align="left"
        )

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    how = {"lag": "", "counted": "", "no group": " (no group yet)", "estimated": " (estimated)"}
    backlog = ("~" if not st.backlog_exact else "") + f"{st.backlog:,}"
    grid.add_row(
        "load-balancer stream",
        f"{st.length:,} entries: [bold]{backlog}[/] waiting{how.get(st.backlog_method, '')}, "
        f"[bold]{st.pending:,}[/] pending (held)",
    )
    if st.oldest_waiting:
        grid.add_row(
            "oldest waiting",
            f"{st.oldest_waiting.id}, waiting for {duration(st.oldest_waiting.age_ms)}",
        )
    if st.oldest_pending:
        p = st.oldest_pending
        grid.add_row(
            "oldest pending",
            Text(
                f"{p.id}, held by {p.consumer}: added {duration(p.age_ms)} ago, idle {duration(p.idle_ms)}, "
                f"{p.deliveries} deliver{'y' if p.deliveries == 1 else 'ies'}"
            ),
        )
    counts = [(s, st.count(s)) for s in ("alive", "late", "dead", "departed")]
    grid.add_row(
        "consumers",
        ", ".join(f"[{_STATE_STYLE[s]}]{n} {s}[/]" if n else f"{n} {s}" for s, n in counts),
    )
    rq = st.requeued
    if rq.looked_at:
        among = (
            f"all {rq.looked_at:,} waiting"
            if rq.complete
            else f"the {rq.looked_at:,} newest waiting"
        )
        grid.add_row(
            "re-queued",
            f"{rq.requeued:,} of {among} ({rq.retried:,} with a retry counted, "
            f"{rq.replayed:,} replayed from dead letters)",
        )
    if st.names_waiting:
        grid.add_row("waiting for a holder", Text(_waiting_names(st)))
    if st.delayed:
        d = st.delayed
        due = f", next due in {duration(d.next_due_ms)}" if d.next_due_ms is not None else ""
        grid.add_row("delayed retries", f"{d.parked:,} parked{due}")
    dl_style = "bold red" if st.dead_letters else ""
    grid.add_row(
        "dead letters",
        Text(f"{st.dead_letters:,}", style=dl_style) + Text(f" in {st.dead_letter_stream}")
        if st.dead_letter_stream
        else Text("dropped (no dead-letter stream)"),
    )
    for note in st.notes:
        grid.add_row("note", Text(note, style="yellow"))
    parts: list[RenderableType] = [
        Panel(
            grid,
            title=title,
            subtitle=subtitle,
            title_align="left",
            subtitle_align="left",
            box=box.ROUNDED,
        )
    ]

    shown = [c for c in st.consumers if c.state != "departed"]
    if shown:
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        table.add_column("consumer", no_wrap=True, overflow="ellipsis", max_width=40)
        table.add_column("state", no_wrap=True)
        table.add_column("held", justify="right")
        table.add_column("idle", justify="right")
        table.add_column("deadline", justify="right")
        table.add_column("instance marker", justify="right")
        table.add_column("holds (token, registered ago)", overflow="fold")
        for c in shown[:max_rows]:
            table.add_row(
                c.name,
                Text(c.state, style=_STATE_STYLE[c.state]),
                f"{c.pending:,}",
                duration(c.idle_ms),
                duration(c.deadline_ms, signed=True),
                _marker(c),
                _holds(c),
            )
        if len(shown) > max_rows:
            table.caption = f"{len(shown) - max_rows} more not shown (--json lists every consumer)"
        parts.append(table)
    if st.keys:
        keys = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        keys.add_column("held key", no_wrap=True, overflow="ellipsis", max_width=40)
        keys.add_column("consumer", no_wrap=True, overflow="ellipsis", max_width=40)
        keys.add_column("backlog", justify="right")
        keys.add_column("position", no_wrap=True)
        keys.add_column("tries", justify="right")
        keys.add_column("failures", justify="right")
        for k in st.keys[:max_rows]:
            keys.add_row(
                k.key,
                k.consumer,
                f"{k.backlog:,}",
                k.position or "-",
                f"{k.tries}" if k.holder else "not fetched",
                f"{k.failures}{' (one at a time)' if k.isolating else ''}"
                if k.failures or k.isolating
                else "-",
            )
        shown_backlog = sum(k.backlog for k in st.keys)
        keys.caption = f"{len(st.keys):,} held keys, {shown_backlog:,} messages waiting in them" + (
            f"; {len(st.keys) - max_rows} more not shown (--json lists them)"
            if len(st.keys) > max_rows
            else ""
        )
        parts.append(keys)
    if st.reasons:
        reasons = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        reasons.add_column(
            f"dead-letter reason (newest {st.reasons_over:,} letters)",
            overflow="ellipsis",
            no_wrap=True,
            max_width=90,
        )
        reasons.add_column("letters", justify="right", no_wrap=True, min_width=7)
        for r in st.reasons[:5]:
            reasons.add_row(r.reason or "(none)", f"{r.count:,}")
        if len(st.reasons) > 5:
            reasons.caption = f"{len(st.reasons) - 5} other reasons"
        parts.append(reasons)
    return Group(*parts)


def _waiting_names(st: ServiceStatus) -> str:
    """``N data streams have registrations waiting for their holder: name (2 after <id>), ...``."""
    names = ", ".join(
        f"{w.name} ({w.waiting:,} after {w.holder}{', put back' if w.back else ''})"
        for w in st.waiting_names[:HOLDS_SHOWN]
    )
    shown = min(HOLDS_SHOWN, len(st.waiting_names))
    rest = f", +{st.names_waiting - shown:,} more" if shown and st.names_waiting > shown else ""
    return (
        f"{st.names_waiting:,} data stream{'s' if st.names_waiting != 1 else ''} with registrations waiting "
        f"for their holder" + (f": {names}{rest}" if names else "")
    )


#: Held streams named per consumer on the screen (``--json`` has every one sampled).
HOLDS_SHOWN = 3


def _holds(c: ConsumerStatus) -> str:
    """``name (token 12, 3s), ...`` for the first :data:`HOLDS_SHOWN` streams ``c`` holds; ``+N`` for the rest."""
    parts = [
        f"{h.stream or h.entry_id} ({'lock gone' if h.token is None else f'token {h.token}'}, "
        f"{duration(h.age_ms)})"
        for h in c.held[:HOLDS_SHOWN]
    ]
    more = c.pending - len(parts)
    return ", ".join(parts) + (f", +{more:,}" if more > 0 and parts else "")


def _marker(c: ConsumerStatus) -> str:
    if c.instance_ttl_ms is None:
        return "none"
    return "no TTL" if c.instance_ttl_ms < 0 else duration(c.instance_ttl_ms)


# -------------------------------------------------------------------- claim ---

_ENTRY_ID = re.compile(r"[0-9]+-[0-9]+\Z")


def _entry_ids(values: list[str]) -> list[str]:
    bad = [v for v in values if not _ENTRY_ID.match(v)]
    if bad:
        raise typer.BadParameter(f"not a stream id (<milliseconds>-<sequence>): {', '.join(bad)}")
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class ClaimOutcome:
    """What ``lbs claim`` did with one entry id."""

    entry_id: str
    #: ``requeued``, ``dead-lettered``, ``locked`` (its holder's lock is alive), ``not pending``, or
    #: ``not claimed`` (pending and unlocked, yet the claim did not act: a key of the wrong type, see the log).
    outcome: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"entry_id": self.entry_id, "outcome": self.outcome, "detail": self.detail}


class _Outcomes:
    """Hooks of the short-lived client: what each claim became."""

    def __init__(self) -> None:
        self.requeued: dict[str, tuple[str, int]] = {}
        self.dead: dict[str, str] = {}

    @hookimpl
    def lbs_stream_expired(self, entry_id: str, new_entry_id: str, retry_count: int) -> None:
        self.requeued[entry_id] = (new_entry_id, retry_count)

    @hookimpl
    def lbs_stream_dead_lettered(self, entry_id: str, dead_letter_id: str) -> None:
        self.dead[entry_id] = dead_letter_id


def claim(
    service: ServiceArgument,
    entry_ids: Annotated[
        list[str],
        typer.Argument(
            metavar="ENTRY_ID...",
            help="Entry ids of the load-balancer stream (`MILLISECONDS-SEQUENCE`), as "
            "`lbs status` or XPENDING show them.",
            callback=_entry_ids,
            show_default=False,
        ),
    ],
    url: UrlOption,
    max_retries: Annotated[
        int,
        typer.Option(
            min=-1,
            metavar="N",
            help="The service's `Config.max_retries`: an entry past it goes to the dead-letter "
            "stream instead (-1: never).",
        ),
    ] = 3,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON array of `{entry_id, outcome, detail}`.")
    ] = False,
) -> None:
    """Re-queue assignments now if their lock is gone (a holder that died), with one retry counted.

    The same atomic re-queue recovery does (the lock must be gone: a live
    holder keeps its stream), by a short-lived consumer
    `lbs-cli-HOST-PID` that reads nothing. Exit code 0 when every id was
    re-queued, dead-lettered or is not pending; 3 when some is still locked
    (or could not be claimed); 1 when Redis fails.
    """
    check_service("claim", service)
    results = run("claim", lambda: _claim(url, service, entry_ids, max_retries), url)
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in results]) + "\n")
    else:
        console = Console()
        style = {"requeued": "green", "dead-lettered": "yellow", "not pending": "dim"}
        for r in results:
            console.print(
                Text(r.entry_id + "  ")
                + Text(r.outcome, style=style.get(r.outcome, "bold red"))
                + Text(f"  {r.detail}" if r.detail else "")
            )
    if any(r.outcome in ("locked", "not claimed") for r in results):
        raise typer.Exit(EXIT_INCOMPLETE)


async def _claim(
    url: str, service: str, entry_ids: list[str], max_retries: int
) -> list[ClaimOutcome]:
    outcomes = _Outcomes()
    # No reader, recovery or heartbeat is ever started: the client only runs requeue-6.lua through claim().
    # retry_delay 0: what is claimed comes back at once, not parked for a delay.
    config = Config(
        recovery=False, configure_keyspace_events=False, max_retries=max_retries, retry_delay=0.0
    )
    client = Client(
        url,
        service,
        consumer_id=f"lbs-cli-{socket.gethostname()}-{os.getpid()}",
        config=config,
        plugins=[outcomes],
        load_entrypoint_plugins=False,
    )
    taken: dict[str, bool] = {}
    try:
        await client.reset_topology()  # on a cluster: route to the slot's owner (a no-op otherwise)
        for entry_id in entry_ids:
            taken[entry_id] = await client.claim(entry_id)
    finally:
        await client.close()
    # Why the others were not taken: their lock (and its holder), or nothing pending.
    left = [i for i in entry_ids if not taken[i]]
    locks: dict[str, Any] = {}
    pending: dict[str, bool] = {}
    if left:
        async with owner(url, _keys.input_stream(service)) as r:
            pipe = r.pipeline(transaction=False)
            for entry_id in left:
                pipe.get(_keys.lock_key(service, entry_id))
                pipe.xpending_range(
                    _keys.input_stream(service), _keys.group_name(service), entry_id, entry_id, 1
                )
            try:
                replies = await pipe.execute(raise_on_error=False)
            finally:
                await pipe.reset()  # type: ignore[no-untyped-call]
        for k, entry_id in enumerate(left):
            locks[entry_id], p = replies[2 * k], replies[2 * k + 1]
            pending[entry_id] = bool(p) and not isinstance(p, Exception)
    out = []
    for entry_id in entry_ids:
        if entry_id in outcomes.requeued:
            new_id, retries = outcomes.requeued[entry_id]
            out.append(ClaimOutcome(entry_id, "requeued", f"as {new_id} (retry {retries})"))
        elif entry_id in outcomes.dead:
            out.append(
                ClaimOutcome(
                    entry_id,
                    "dead-lettered",
                    f"as {outcomes.dead[entry_id]} (past --max-retries {max_retries})",
                )
            )
        elif taken[entry_id]:
            out.append(ClaimOutcome(entry_id, "requeued", ""))
        elif isinstance(locks.get(entry_id), Exception):
            out.append(ClaimOutcome(entry_id, "not claimed", f"its lock key: {locks[entry_id]}"))
        elif locks.get(entry_id) is not None:
            out.append(ClaimOutcome(entry_id, "locked", f"held by {_holder(locks[entry_id])}"))
        elif not pending.get(entry_id):
            out.append(
                ClaimOutcome(
                    entry_id, "not pending", "finished, recovered already, or never delivered"
                )
            )
        else:
            out.append(
                ClaimOutcome(
                    entry_id, "not claimed", "pending without a lock, yet refused (see the log)"
                )
            )
    return out


def _holder(value: Any) -> str:
    """The consumer in a lock value ``<token>:<consumer id>:<instance>``."""
    value = reply_text(value, "replace")
    token, _, rest = value.partition(":")
    consumer, _, instance = rest.rpartition(":")
    return f"{consumer} (instance {instance}, token {token})" if consumer else value


@asynccontextmanager
async def owner(url: str, key: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the Redis that holds ``key`` (on a cluster, its slot's master), closed after."""
    client, owned = resolve_client(url)
    node: aioredis.Redis | None = None
    try:
        if isinstance(client, RedisCluster):
            node, _ = await slot_owner(client, key)
            yield node
        else:
            yield client
    finally:
        if node is not None:
            await node.aclose()
        if owned:
            await client.aclose()
