"""``lbs worker MODULE:HANDLER``: run a handler as a service, in one process or under a supervisor.

One process (``--processes 1``, the default) runs :meth:`lbs.Client.run`
(:class:`lbs.ShardedClient` with ``--shards``) in this process: SIGTERM or
SIGINT stops reading, lets running handlers finish for ``drain_timeout``, hands
the rest back without a retry counted, and exits 0. With ``--processes N`` this
process is a supervisor (:mod:`lbs.cli.supervisor`) of N such workers.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .._keys import validate_service
from .._redis.connection import resolve_client
from ..client import consumer_id_from_env
from ..config import Config
from ..exceptions import ConfigurationError
from ..plugins import make_plugin_manager
from ._common import (
    EXIT_CONFIG,
    EXIT_OK,
    err_console,
    fail,
    mask_url,
    setup_logging,
)
from .banner import banner, plugin_names
from .services import warn_if_new
from .serving import handler_failed, run_in_process, takes_keyed_batch
from .settings import (
    HandlerError,
    WorkerSettings,
    changed_fields,
    field_type,
    load_handler,
    resolve_config,
)
from .supervisor import supervise

__all__ = ["WorkerSettings", "run_in_process", "worker"]

log = logging.getLogger("lbs.worker")

#: Where ``lbs worker`` connects without ``--url`` or ``$LBS_URL``.
DEFAULT_URL = "redis://localhost:6379/0"


# ----------------------------------------------------------------- command ---


def _toml_value(name: str, value: Any) -> str | None:
    if value is None:
        return None if field_type(name)[0] is str else '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def settings_toml(config: Config, sources: dict[str, str]) -> str:
    """``config`` as an ``[lbs]`` table for ``--config`` (every field; the source of each that was set)."""
    lines = ["[lbs]"]
    for f in dataclasses.fields(Config):
        value = getattr(config, f.name)
        text = _toml_value(f.name, value)
        note = f"  # {sources[f.name]}" if f.name in sources else ""
        lines.append(f"# {f.name}: not set (None)" if text is None else f"{f.name} = {text}{note}")
    return "\n".join(lines) + "\n"


def _default_consumer_id(explicit: str | None) -> str:
    """``--consumer-id``, else POD_NAME / POD_IP (the Go client's rule), else ``<hostname>-<pid>``; prefixed."""
    raw = (
        explicit
        or os.environ.get("POD_NAME")
        or os.environ.get("POD_IP")
        or f"{socket.gethostname()}-{os.getpid()}"
    )
    try:
        return consumer_id_from_env(raw)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--consumer-id'") from None


def _check_service(value: str) -> str:
    try:
        return validate_service(value)
    except ConfigurationError as exc:
        fail(
            "worker", f"invalid --service: {exc}", EXIT_CONFIG
        )  # a bad setting: 78, as in every command


def _check_url(value: str) -> str:
    try:
        resolve_client(value)  # parses the URL and its options; connects to nothing
    except ConfigurationError as exc:
        fail("worker", f"invalid --url {mask_url(value)}: {exc}", EXIT_CONFIG)
    return value


class LogFormat(str, enum.Enum):
    text = "text"
    json = "json"


class LogLevel(str, enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


_SETTINGS = "Settings (lbs.Config; flags > LBS_<FIELD> > --config file > defaults)"


def worker(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:HANDLER",
            show_default=False,
            help="The handler: an async function taking an lbs.Notification, as module:name (e.g. myapp.work:handle).",
        ),
    ],
    service: Annotated[
        str,
        typer.Option(
            envvar="LBS_SERVICE",
            callback=_check_service,
            show_default=False,
            help="The service whose LBS (`<service>-input`) to consume. Required.",
        ),
    ],
    url: Annotated[
        str,
        typer.Option(
            envvar="LBS_URL",
            callback=_check_url,
            help="Redis URL (redis://, rediss://, redis+cluster://, redis+sentinel://HOST:PORT[,...]/SERVICE_NAME[/DB]; "
            "a password is masked in output).",
        ),
    ] = DEFAULT_URL,
    consumer_id: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="Consumer id. Default: $POD_NAME, else $POD_IP, else `<hostname>-<pid>`; prefixed `redis-consumer-`. "
            "With --processes N each child gets `<id>-0` ... `<id>-(N-1)`.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="LBS_CONCURRENCY",
            show_default=False,
            help="Handlers running at once, per process. Default: max_streams.",
        ),
    ] = None,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="LBS_PROCESSES",
            help="Worker processes. Above 1, this process supervises them: restarts a crashed one with back-off, "
            "forwards SIGTERM/SIGINT, exits when all have ended.",
        ),
    ] = 1,
    shards: Annotated[
        int,
        typer.Option(
            min=1, envvar="LBS_SHARDS", help="Shards of the service (lbs.ShardedClient above 1)."
        ),
    ] = 1,
    previous_shards: Annotated[
        list[int] | None,
        typer.Option(
            "--previous-shards",
            min=1,
            metavar="N",
            help="While changing --shards: the old count, whose shards are read too while they "
            "exist (repeatable). Drop it once they are empty (lbs status).",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="LBS_CONFIG",
            show_default=False,
            dir_okay=False,
            rich_help_panel=_SETTINGS,
            help="TOML file whose \\[lbs] table sets Config fields (e.g. lock_ttl = 5).",
        ),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="FIELD=VALUE",
            show_default=False,
            rich_help_panel=_SETTINGS,
            help="Set any Config field (repeatable), e.g. --set read_block=0.5.",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            show_default=False,
            rich_help_panel=_SETTINGS,
            help="Cancel a handler after this many seconds and hand its stream back with a retry counted "
            "(Config.handler_timeout).",
        ),
    ] = None,
    lock_ttl: Annotated[
        float | None,
        typer.Option(
            show_default=False,
            rich_help_panel=_SETTINGS,
            help="Config.lock_ttl: the TTL of the consumer's lease, seconds (a dead consumer's "
            "streams are recovered after it).",
        ),
    ] = None,
    max_streams: Annotated[
        int | None,
        typer.Option(
            show_default=False,
            rich_help_panel=_SETTINGS,
            help="Config.max_streams: streams held at once.",
        ),
    ] = None,
    max_retries: Annotated[
        int | None,
        typer.Option(
            show_default=False,
            rich_help_panel=_SETTINGS,
            help="Config.max_retries: failed attempts before the dead-letter stream.",
        ),
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            show_default=False,
            rich_help_panel=_SETTINGS,
            help="Config.drain_timeout (default 20, inside Kubernetes' 30 s grace): on SIGTERM/SIGINT, seconds "
            "running handlers get before their streams are handed back.",
        ),
    ] = None,
    keyed: Annotated[
        bool | None,
        typer.Option(
            "--keyed/--not-keyed",
            show_default=False,
            help="Run the handler on keys published with lbs.Publisher (run_keyed: it takes an lbs.KeyedBatch of "
            "one key's messages, in order). Default: when the handler's first parameter is annotated "
            "lbs.KeyedBatch.",
        ),
    ] = None,
    batch: Annotated[
        int,
        typer.Option(
            min=1, envvar="LBS_BATCH", help="With --keyed: most messages of a key per handler call."
        ),
    ] = 100,
    linger: Annotated[
        float,
        typer.Option(
            min=0,
            envvar="LBS_LINGER",
            help="With --keyed: seconds a drained key stays with this worker, woken by the next "
            "message published for it (0: let it go at once).",
        ),
    ] = 5.0,
    app_dir: Annotated[
        str, typer.Option(help="Directory put first on sys.path to import MODULE from.")
    ] = ".",
    log_level: Annotated[
        LogLevel,
        typer.Option(
            envvar="LBS_LOG_LEVEL",
            case_sensitive=False,
            help="Log records from this level up, to stderr.",
        ),
    ] = LogLevel.info,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar="LBS_LOG_FORMAT",
            case_sensitive=False,
            help="text: a line per record (rich on a terminal); json: one JSON object per line, with the "
            "service, consumer, stream or key, entry id, token and retry count as fields (lbs.logs).",
        ),
    ] = LogFormat.text,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Check everything but Redis, print the resolved settings as a TOML \\[lbs] table "
            "(with each value's source), and exit.",
        ),
    ] = False,
) -> None:
    """Run MODULE:HANDLER as a service: one handler call per assigned data stream, until SIGTERM/SIGINT.

    With --keyed (or a handler whose first parameter is annotated lbs.KeyedBatch), one call per batch
    of a held key's messages, in order (lbs.Client.run_keyed).

    A signal stops reading, lets running handlers finish for drain_timeout, hands the rest back
    without a retry counted, and exits 0. Exit codes: 0 a clean stop; 1 a failure at run time
    (Redis unreachable at start, a supervisor's child that keeps crashing); 2 a usage error
    (options, MODULE:HANDLER); 78 an invalid setting (EX_CONFIG).

    Metrics: with lbs-prometheus installed (the prometheus extra), /metrics, /livez and /readyz are
    served only once LBS_PROMETHEUS_PORT is set (e.g. 9464: http://127.0.0.1:9464/metrics; the
    address is LBS_PROMETHEUS_ADDR, default 127.0.0.1; with --processes N, ports PORT to PORT+N-1).
    Without it no port is opened.
    """
    level = log_level.value.upper()
    setup_logging(level, log_format.value)
    try:
        handler = load_handler(target, app_dir)
    except HandlerError as exc:
        if exc.usage:
            raise typer.BadParameter(str(exc), param_hint="'MODULE:HANDLER'") from None
        raise typer.Exit(handler_failed(exc, log_format.value)) from None
    flags = {
        "handler_timeout": ("--timeout", timeout),
        "lock_ttl": ("--lock-ttl", lock_ttl),
        "max_streams": ("--max-streams", max_streams),
        "max_retries": ("--max-retries", max_retries),
        "drain_timeout": ("--drain-timeout", drain_timeout),
    }
    try:
        config, layers = resolve_config(config_file, os.environ, sets or [], flags)
    except ValueError as exc:
        if not isinstance(exc, ConfigurationError):
            raise typer.BadParameter(str(exc), param_hint="'--set'") from None
        fail("worker", f"invalid configuration: {exc}", EXIT_CONFIG)
    for warning in layers.warnings:
        log.warning("%s", warning)
    base = _default_consumer_id(consumer_id)
    s = WorkerSettings(
        target=target,
        app_dir=app_dir,
        url=url,
        service=service,
        consumer_id=base,
        consumer_base=base,
        concurrency=concurrency,
        processes=processes,
        shards=shards,
        previous_shards=list(previous_shards or []),
        config=dataclasses.asdict(config),
        sources={name: layers.sources.get(name, "?") for name in changed_fields(config)},
        log_level=level,
        log_format=log_format.value,
        keyed=takes_keyed_batch(handler) if keyed is None else keyed,
        batch=batch,
        linger=linger,
    )
    if check:
        sys.stdout.write(settings_toml(config, s.sources))
        pm = make_plugin_manager(disabled=config.disabled_plugins)
        err_console.print(
            banner(s, config, plugins=plugin_names(pm), server="not connected: --check")
        )
        raise typer.Exit(EXIT_OK)
    warn_if_new(s.url, s.service, s.shards)  # a mistyped --service starts a new service: say so
    if processes == 1:
        raise typer.Exit(run_in_process(s, handler))
    raise typer.Exit(supervise(s))
