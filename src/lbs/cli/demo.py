"""``lbs demo``: the demo of :mod:`lbs._demo` on an embedded Redis, or on one given with ``--redis-url``."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from ..exceptions import LbsError
from ._common import EXIT_FAILURE, EXIT_OK, fail, mask_url

__all__ = ["demo"]


def demo(
    streams: Annotated[int, typer.Option(min=1, help="Data streams to register.")] = 6,
    consumers: Annotated[int, typer.Option(min=1, help="Consumers in the group.")] = 2,
    service: Annotated[str, typer.Option(help="Service name; the LBS is `<service>-input`.")] = "demo",
    redis_url: Annotated[str | None, typer.Option(
        show_default=False,
        help="Use this Redis instead of starting an embedded one (its data is left alone but for the demo's "
             "keys).")] = None,
) -> None:
    """Write work with a Spark job and process it with consumers on an embedded Redis.

    Start a throwaway redis-server (>= 8.4, found as scripts/redis.sh provides it), write the work
    with a local Spark job through the lbs Spark sink (with lbs.Producer when pyspark, the lbs\\[spark]
    extra, is not installed), process it with consumers in one group, print what happened, and
    check nothing is left behind. Exits 0 on success, 1 otherwise.
    """
    from .._demo import run_demo
    from ..embedded import RedisServer

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if redis_url:
            print(f"lbs demo: using {mask_url(redis_url)}")
            result = asyncio.run(run_demo(redis_url, service=service, streams=streams, consumers=consumers))
        else:
            with RedisServer() as server:
                v = ".".join(map(str, server.version))
                print(f"lbs demo: embedded Redis {v} at {server.url} (pid {server.pid})")
                result = asyncio.run(run_demo(server.url, service=service, streams=streams, consumers=consumers))
    except LbsError as exc:
        fail("demo", str(exc))
    print("lbs demo: OK" if result.ok else "lbs demo: FAILED")
    raise typer.Exit(EXIT_OK if result.ok else EXIT_FAILURE)
