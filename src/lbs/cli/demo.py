"""``lbs demo``: the demo of :mod:`lbs._demo` on an embedded Redis, or on one given with ``--url``."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer
from rich.console import Console
from rich.status import Status

from ..exceptions import LbsError
from ._common import EXIT_FAILURE, EXIT_OK, explain, fail, mask_url

__all__ = ["demo"]


class _Spinner:
    """The demo's ``progress``: a status line with a spinner on a terminal (nothing elsewhere), gone when told None."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._status: Status | None = None

    def __call__(self, text: str | None) -> None:
        if text is None:
            if self._status is not None:
                self._status.stop()
                self._status = None
        elif self._status is None:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._status.update(text)


def demo(
    streams: Annotated[int, typer.Option(min=1, help="Data streams to register.")] = 6,
    consumers: Annotated[int, typer.Option(min=1, help="Consumers in the group.")] = 2,
    service: Annotated[
        str,
        typer.Option(
            help="Service name: the LBS is `<service>-input`, and every key the demo writes (then deletes) is "
            "`<service>-input`, `{<service>-input}:*` or `lock:{<service>-input}:*`, or the same for "
            "`<service>-tickets`. If any exists the demo refuses to start."
        ),
    ] = "demo",
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--url",
            "--redis-url",
            envvar="LBS_URL",
            show_envvar=True,
            show_default=False,
            help="Use this Redis (>= 7.0) instead of starting an embedded one; nothing in it but the demo's own "
            "keys (see --service) is written or deleted. (--redis-url: the older spelling.)",
        ),
    ] = None,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark/--no-spark",
            help="Write the work with a local Spark job (its JVM takes tens of seconds to start), or with "
            "lbs.Producer.",
        ),
    ] = True,
) -> None:
    """Write work with a Spark job and process it with consumers on an embedded Redis.

    Start a throwaway redis-server (>= 8.4, found as scripts/redis.sh provides it) or use the one at
    --url, write the work with a local Spark job through the lbs Spark sink (with lbs.Producer
    with --no-spark, or when pyspark, the lbs\\[spark] extra, or Java is missing), process it with
    consumers in one group, print what happened, check nothing is left behind, and delete the demo's
    keys. Exits 0 on success, 1 otherwise (a key of the service already there included).
    """
    from .._demo import DemoResult, run_demo
    from ..embedded import RedisServer

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(highlight=False, soft_wrap=True)

    def out(line: str) -> None:
        console.print(line, markup=False)

    progress = _Spinner(console)

    def run(url: str) -> DemoResult:
        return asyncio.run(
            run_demo(
                url,
                service=service,
                streams=streams,
                consumers=consumers,
                spark=spark,
                out=out,
                progress=progress,
            )
        )

    try:
        if redis_url:
            out(f"lbs demo: using {mask_url(redis_url)}")
            result = run(redis_url)
        else:
            with RedisServer() as server:
                v = ".".join(map(str, server.version))
                out(f"lbs demo: embedded Redis {v} at {server.url} (pid {server.pid})")
                result = run(server.url)
    except LbsError as exc:
        fail("demo", explain(exc, redis_url or ""))
    finally:
        progress(None)
    out("lbs demo: OK" if result.ok else "lbs demo: FAILED")
    raise typer.Exit(EXIT_OK if result.ok else EXIT_FAILURE)
