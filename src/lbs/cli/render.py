"""``lbs status``'s screen: a service's :class:`~lbs.status.ServiceStatus` as rich renderables."""

from __future__ import annotations

import time

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..status import ConsumerStatus, ServiceStatus, ShardedStatus, ShardStatus
from ._common import duration

__all__ = ["HOLDS_SHOWN", "render_shards", "render_status", "uneven_warning"]

_STATE_STYLE = {"alive": "green", "late": "yellow", "dead": "bold red", "departed": "dim"}


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
    if not st.exists and not st.delayed:
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
    if st.paused:
        pz = st.paused
        grid.add_row(
            Text("PAUSED", style="bold yellow"),
            Text(
                f"by {pz.by}"
                + (f" {duration(pz.age_ms)} ago" if pz.since_ms else "")
                + (f": {pz.reason}" if pz.reason else "")
                + "; consumers take nothing new (lbs resume)"
            ),
        )
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
        grid.add_row(
            "parked", f"{d.parked:,} (retries, scheduled registrations, delayed messages){due}"
        )
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
        table.add_column("lease", justify="right")
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
        f"{h.stream or h.entry_id} ({'token unknown' if h.token is None else f'token {h.token}'}, "
        f"{duration(h.age_ms)})"
        for h in c.held[:HOLDS_SHOWN]
    ]
    more = c.pending - len(parts)
    return ", ".join(parts) + (f", +{more:,}" if more > 0 and parts else "")


def _marker(c: ConsumerStatus) -> str:
    if c.lease_ttl_ms is None:
        return "none"
    return "no TTL" if c.lease_ttl_ms < 0 else duration(c.lease_ttl_ms)


def uneven_warning(sh: ShardedStatus) -> str:
    """What to do when the masters' shard counts differ by more than one ("" when they do not)."""
    if sh.balanced:
        return ""
    counts = sorted(sh.masters.values(), reverse=True)
    return (
        f"uneven: the {len(counts)} masters own {', '.join(map(str, counts))} of the "
        f"{sh.shard_count} shards; the busiest master caps the service. Move a shard's slot from a "
        "master with more to one with fewer (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE, "
        "CLUSTER SETSLOT NODE), or even out the masters' slots (redis-cli --cluster rebalance) "
        "and look again: docs/operations.md, Sharded LBS."
    )


def _consumers(st: ServiceStatus) -> Text:
    counts = [(s, st.count(s)) for s in ("alive", "late", "dead")]
    out = Text(f"{counts[0][1]} alive", style=_STATE_STYLE["alive"] if counts[0][1] else "")
    for state, n in counts[1:]:
        if n:
            out.append(f", {n} {state}", style=_STATE_STYLE[state])
    return out


def _legacy_note(shard: ShardStatus) -> Text:
    st = shard.status
    head = Text(f"legacy {shard.name}", style="yellow")
    if not shard.empty:
        return head + Text(f" ({shard.why}): holds work; consumers read it while its LBS exists")
    letters = f" (its {st.dead_letters:,} dead letters with them)" if st.dead_letters else ""
    return head + Text(
        f" ({shard.why}): empty; delete {st.stream} and {{{st.stream}}}:*{letters}", style="dim"
    )


def render_shards(sh: ShardedStatus, *, url: str = "", footer: str = "") -> RenderableType:
    """A sharded service's placement as one screen: a row per shard (slot, master, backlog,
    pending, consumers, dead letters; PAUSED), the legacy shards flagged (with what to do with each), and
    how many shards each master owns (a warning with the fix when they differ by more than one)."""
    kind = "cluster" if sh.cluster else "single Redis"
    title = f"[bold]lbs status {sh.service}[/] · {sh.shard_count} shards · {kind}" + (
        f" · {url}" if url and not sh.cluster else ""
    )
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("shard", no_wrap=True)
    table.add_column("slot", justify="right")
    table.add_column("master", no_wrap=True)
    table.add_column("waiting", justify="right")
    table.add_column("pending", justify="right")
    table.add_column("consumers", no_wrap=True)
    table.add_column("dead letters", justify="right")
    table.add_column("", no_wrap=True)
    for shard in sh.shards:
        st = shard.status
        backlog = ("~" if not st.backlog_exact else "") + f"{st.backlog:,}"
        mark = "legacy" if shard.legacy else ("no LBS yet" if not st.exists else "")
        if st.paused:
            mark = f"{mark} PAUSED".strip()
        table.add_row(
            Text(shard.name, style="yellow" if shard.legacy else "bold"),
            f"{shard.slot}",
            shard.node,
            backlog,
            f"{st.pending:,}",
            _consumers(st),
            Text(f"{st.dead_letters:,}", style="bold red" if st.dead_letters else ""),
            Text(mark, style="yellow" if shard.legacy or st.paused else "dim"),
        )
    lines = [_legacy_note(shard) for shard in sh.shards if shard.legacy]
    owned = ", ".join(f"{node} {n}" for node, n in sh.masters.items())
    lines.append(Text(f"shards per master: {owned}"))
    warning = uneven_warning(sh)
    if warning:
        lines.append(Text(warning, style="bold yellow"))
    return Panel(
        Group(table, *lines),
        title=title,
        subtitle=footer or None,
        title_align="left",
        subtitle_align="left",
        box=box.ROUNDED,
    )
