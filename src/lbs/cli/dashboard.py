"""``lbs dashboard SERVICE...``: the web dashboard (:mod:`lbs.dashboard`) served by uvicorn.

A plain typer command function; the ``lbs`` app registers it when the ``[dashboard]`` extra is
installed (else ``lbs dashboard`` says how to install it). Exit codes are those of
:mod:`lbs.cli._common`: 0 a clean stop (Ctrl-C, SIGTERM), 1 Redis unreachable at start, the
port taken (the line names --port), or a service that is not there (neither its load-balancer
stream nor its dead letters), 2 a usage error (a non-loopback host without a token), 78 an invalid
setting.
"""

from __future__ import annotations

import errno
import signal
import socket
from typing import Annotated

import typer

from ..exceptions import ConfigurationError
from ._common import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    UrlOption,
    check_service,
    err_console,
    explain,
    fail,
    mask_url,
    run,
    setup_logging,
)
from .services import require_services
from .worker import LogFormat

__all__ = ["dashboard"]


def dashboard(
    services: Annotated[
        list[str],
        typer.Argument(
            metavar="SERVICE",
            help="The services to show (their load-balancer streams are `SERVICE-input`).",
            show_default=False,
        ),
    ],
    url: UrlOption,
    host: Annotated[
        str,
        typer.Option(help="Address to bind. Not loopback: a --token is required."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = 8787,
    actions: Annotated[
        bool,
        typer.Option(
            "--actions",
            help="Allow acting from the pages: replay and purge dead letters, pause and resume the "
            "service, release, cancel or force-claim a held stream (signed in with the token; one "
            "is generated and printed when none is given). Off: read-only.",
        ),
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="LBS_DASHBOARD_TOKEN",
            show_envvar=True,
            help="Guard every page with this token (a login form; scripts send `Authorization: "
            "Bearer TOKEN`).",
        ),
    ] = None,
    refresh: Annotated[
        float,
        typer.Option(
            min=0.2,
            metavar="SECONDS",
            help="Seconds between two live snapshots (read once for every open page, and only "
            "while one is open).",
        ),
    ] = 2.0,
    shards: Annotated[
        int, typer.Option(min=1, help="Shards of each service (the workers' --shards).")
    ] = 1,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar="LBS_LOG_FORMAT",
            case_sensitive=False,
            help="The action log on stderr (sign-in and out, replay, purge: who, what, the result): "
            "text, a line per record; json, one JSON object per line (lbs.logs), with `who`, "
            "`action` and `service` as fields.",
        ),
    ] = LogFormat.text,
) -> None:
    """Serve a web dashboard of SERVICE... on http://HOST:PORT until Ctrl-C or SIGTERM.

    Pages: an overview of each service (waiting, held, parked, dead letters, consumers, the last
    hour's throughput and failures), its consumers and what they hold, a stream search, the
    recovery timeline, the last hour's failed attempts and the dead letters with their tracebacks
    (with --actions: replay and purge letters, pause and resume, release, cancel and force-claim
    held streams).
    Read-only and bound to 127.0.0.1 unless told otherwise; a URL's password is never shown.
    Every action is logged to stderr.
    """
    setup_logging("INFO", log_format.value)  # the action log (lbs.dashboard), uvicorn's warnings
    try:
        import uvicorn

        from ..dashboard import DashboardSettings, create_app
    except ModuleNotFoundError as exc:
        fail(
            "dashboard",
            f"the dashboard needs {exc.name}: pip install 'lbs-streams[dashboard]'",
            EXIT_FAILURE,
        )
    for service in services:
        check_service("dashboard", service)
    try:
        settings = DashboardSettings.make(
            url,
            services,
            host=host,
            port=port,
            actions=actions,
            token=token or None,
            refresh=refresh,
            shards=shards,
        )
    except ConfigurationError as exc:
        code = EXIT_USAGE if "not loopback" in str(exc) or "token" in str(exc) else EXIT_CONFIG
        fail("dashboard", str(exc), code)
    run("dashboard", lambda: _ping(url), url)
    run("dashboard", lambda: require_services(url, services, shards), url)  # exit 1 on a typo
    listening = _listen(host, port)  # before the banner: a taken port is one line naming --port
    port = listening.getsockname()[1]  # --port 0: the one the system chose
    shown = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    err_console.print(
        f"lbs dashboard: {shown} · {', '.join(settings.shown_services)} on {mask_url(url)} · "
        + ("actions on" if actions else "read-only")
        + f" · live every {refresh:g} s",
        markup=False,
        highlight=False,
    )
    if settings.token_generated:
        err_console.print(
            f"lbs dashboard: the token (shown once): {settings.token}\n"
            f"lbs dashboard: sign in with {shown}/login?token={settings.token}",
            markup=False,
            highlight=False,
        )
    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        log_level="warning",
        log_config=None,  # uvicorn's records go to the handler setup_logging put on the root
        access_log=False,
        # Open live streams never end by themselves: a stop waits this long for them.
        timeout_graceful_shutdown=2,
        lifespan="on",
    )
    # uvicorn stops cleanly on SIGTERM or Ctrl-C, then raises the signal again once it restored
    # the handlers it found: found these, a clean stop exits 0 (not -15 or 130).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stopped)
    try:
        uvicorn.Server(config).run(sockets=[listening])
    except OSError as exc:
        fail("dashboard", explain(exc), EXIT_FAILURE)
    raise typer.Exit(EXIT_OK)


def _stopped(sig: int, frame: object) -> None:
    """The signal uvicorn raises again after its clean stop: exit 0."""
    raise typer.Exit(EXIT_OK)


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to HOST:PORT for uvicorn to serve on, else exit 1 with the fix (--port)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: past TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            fail(
                "dashboard",
                f"port {port} on {host} is in use by another program: stop it, or pick another "
                "port with --port",
            )
        fail(
            "dashboard",
            f"cannot listen on {host} port {port} ({exc.strerror or exc}): pick another port "
            "with --port, or another address with --host",
        )
    return sock


async def _ping(url: str) -> None:
    """Redis answers (else the command exits 1 with the fix, before serving anything)."""
    from .._redis.connection import resolve_client

    client, _ = resolve_client(url)
    try:
        await client.ping()
    finally:
        await client.aclose()
