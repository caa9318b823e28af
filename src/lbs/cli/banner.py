"""The start banner of ``lbs worker``: what runs, against what, with which settings.

:class:`StartBanner` is a plugin the worker registers on its client; it prints the banner once,
after the plugins' own ``lbs_client_started`` (a server one of them starts is in it), with the
rows plugins add through ``lbs_worker_banner``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import pluggy
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from .. import __version__
from .._keys import input_stream, shard_services
from ..client import Client
from ..config import Config
from ..hookspecs import hookimpl
from ..plugins import collect
from ._common import err_console, mask_url
from .settings import WorkerSettings, changed_fields

__all__ = ["StartBanner", "banner", "banner_rows", "plugin_names", "plugin_rows"]

log = logging.getLogger("lbs.worker")


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g} s"


def banner(
    s: WorkerSettings,
    config: Config,
    *,
    plugins: list[str],
    server: str,
    extra: Sequence[tuple[str, str]] = (),
) -> Panel:
    """The start banner: what runs, against what, with which settings (``extra``: the plugins' rows)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in banner_rows(s, config, plugins=plugins, server=server, extra=extra):
        grid.add_row(key, escape(str(value)))
    return Panel(
        grid,
        title=f"[bold]lbs {escape(__version__)} worker[/] (pid {os.getpid()})",
        title_align="left",
        expand=False,
    )


def banner_rows(
    s: WorkerSettings,
    config: Config,
    *,
    plugins: list[str],
    server: str,
    extra: Sequence[tuple[str, str]] = (),
) -> list[tuple[str, str]]:
    """The banner's rows (``--log-format json`` logs them as one record's ``banner`` field)."""
    services = shard_services(s.service, s.shards)
    lbs_keys = (
        input_stream(s.service)
        if s.shards == 1
        else f"{input_stream(services[0])} … {input_stream(services[-1])} ({s.shards} shards)"
    )
    ids = (
        s.consumer_id
        if s.processes == 1
        else f"{s.consumer_base}-0 … {s.consumer_base}-{s.processes - 1}"
    )
    concurrency = s.concurrency if s.concurrency is not None else config.max_streams
    rows = [
        ("service", s.service),
        ("LBS", lbs_keys),
        ("Redis", f"{mask_url(s.url)}  ({server})"),
        ("consumer id", ids),
        (
            "handler",
            f"{s.target} (keyed: run_keyed, batch {s.batch}, linger {s.linger:g} s)"
            if s.keyed
            else s.target,
        ),
        (
            "concurrency",
            f"{concurrency} per process · processes {s.processes}"
            + (f" · shards {s.shards}" if s.shards > 1 else ""),
        ),
        (
            "config",
            f"lock_ttl {_seconds(config.lock_ttl)} · heartbeat {_seconds(round(config.heartbeat_every, 3))} · "
            f"max_streams {config.max_streams} · read_count {config.read_count or 'auto'} · "
            f"drain_timeout {_seconds(config.drain_timeout)} · "
            f"handler_timeout {_seconds(config.handler_timeout)} · max_retries {config.max_retries} · "
            f"retry_delay {_seconds(config.retry_delay)} · recovery {'on' if config.recovery else 'off'}",
        ),
        (
            "set",
            ", ".join(
                f"{name}={value!r} ({s.sources.get(name, '?')})"
                for name, value in changed_fields(config).items()
            )
            or "nothing: lbs's defaults",
        ),
        ("plugins", ", ".join(plugins) or "none"),
        *extra,
    ]
    return [(key, str(value)) for key, value in rows]


class StartBanner:
    """A plugin that prints the banner once, when the (first) client has started and knows the server."""

    def __init__(self, settings: WorkerSettings, config: Config) -> None:
        self.settings = settings
        self.config = config
        self.printed = False

    @hookimpl(trylast=True)  # after the plugins' own: a server they start is in the banner
    def lbs_client_started(self, client: Client) -> None:
        if self.printed:
            return
        self.printed = True
        # "Valkey 9.1.2", not the Redis 7.2.4 it answers as
        server = client.server_name or "Redis ?"
        plugins, extra = plugin_names(client.pm, self), plugin_rows(client)
        s, config = self.settings, self.config
        if s.log_format == "json":  # one JSON object per line: the banner is a record too
            rows = banner_rows(s, config, plugins=plugins, server=server, extra=extra)
            log.info("lbs %s worker started", __version__, extra={"banner": dict(rows)})
        else:
            err_console.print(banner(s, config, plugins=plugins, server=server, extra=extra))


def plugin_rows(client: Client) -> list[tuple[str, str]]:
    """The rows the plugins add to the banner (``lbs_worker_banner``); one that raises is logged and left out."""
    answers: list[Mapping[str, str]] = collect(client.pm, "lbs_worker_banner", client=client)
    return [(str(k), str(v)) for rows in answers for k, v in rows.items()]


def plugin_names(pm: pluggy.PluginManager, *leave_out: object) -> list[str]:
    """The registered plugins: name, and the distribution of an installed one."""
    dists = {
        id(plugin): f"{dist.project_name} {dist.version}"
        for plugin, dist in pm.list_plugin_distinfo()
    }
    return [
        f"{name} ({dists[id(plugin)]})" if id(plugin) in dists else name
        for name, plugin in pm.list_name_plugin()
        if plugin is not None and all(plugin is not o for o in leave_out)
    ]  # None: a blocked name
