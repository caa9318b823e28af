"""The worker's process: serve a handler until a signal ends it (``lbs worker``'s one process, a
supervisor's child), and its exit code.

:func:`run_in_process` runs :func:`serve` (:meth:`lbs.Client.run`, or :class:`lbs.ShardedClient`
with shards) in this process: SIGTERM or SIGINT stops reading, lets running handlers finish for
``drain_timeout``, hands the rest back without a retry counted, and exits 0.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import sys
import traceback
import typing
from typing import Any

from redis.exceptions import RedisClusterException, RedisError
from rich.markup import escape

from ..client import Client, Handler
from ..config import Config
from ..exceptions import ConfigurationError, LbsError, RedisOperationError
from ..keyed import KeyedBatch
from ..sharding import ShardedClient
from ._common import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    err_console,
    explain,
    mask_url,
    ping,
)
from .banner import StartBanner
from .settings import HandlerError, WorkerSettings, load_handler

__all__ = ["handler_failed", "run_in_process", "serve", "takes_keyed_batch"]

log = logging.getLogger("lbs.worker")


async def serve(s: WorkerSettings, handler: Handler) -> None:
    """Run ``handler`` until a signal (or the client's close) ends it; a signal's drain and hand-back included."""
    await ping(s.url)  # an unreachable Redis is one line (run_in_process), not the client's three
    config = Config(**s.config)
    plugins = [StartBanner(s, config)] if s.banner else []
    client: Client | ShardedClient
    if s.shards > 1 or s.previous_shards:
        client = ShardedClient(
            s.url,
            s.service,
            s.consumer_id,
            config,
            shards=s.shards,
            previous_shards=s.previous_shards,
            plugins=plugins,
        )
    else:
        client = Client(s.url, s.service, s.consumer_id, config, plugins=plugins)
    try:
        if s.keyed:
            await client.run_keyed(
                handler,  # type: ignore[arg-type]
                s.concurrency,
                batch=s.batch,
                linger=s.linger,
            )
        else:
            await client.run(handler, s.concurrency)
    finally:
        await client.close()


def takes_keyed_batch(handler: Any) -> bool:
    """Whether ``handler``'s first parameter is annotated :class:`lbs.KeyedBatch` (a keyed handler)."""
    try:
        params = list(inspect.signature(handler).parameters.values())
        hints = typing.get_type_hints(handler)
    except (TypeError, ValueError, NameError):
        return False
    return bool(params) and hints.get(params[0].name) is KeyedBatch


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_in_process(s: WorkerSettings, handler: Handler | None = None) -> int:
    """Serve in this process; the exit code (see the command's help)."""
    # Until run() routes them (and after it returns), SIGTERM and SIGINT stop the
    # process at once: nothing is held then. During run() they drain and hand back.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    try:
        if handler is None:
            handler = load_handler(s.target, s.app_dir)
        asyncio.run(serve(s, handler))
    except KeyboardInterrupt:
        log.info("stopped before the worker had started")
        return EXIT_OK
    except HandlerError as exc:
        return handler_failed(exc, s.log_format)
    except ConfigurationError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    except RedisOperationError as exc:
        log.error("cannot run against %s: %s", mask_url(s.url), explain(exc, s.url))
        return EXIT_FAILURE
    except (RedisError, RedisClusterException, OSError) as exc:  # ping(): Redis unreachable
        log.error("%s", explain(exc, s.url))
        return EXIT_FAILURE
    except LbsError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        return EXIT_FAILURE
    log.info("stopped")
    return EXIT_OK


def handler_failed(exc: HandlerError, log_format: str = "text") -> int:
    """Report a handler that cannot be loaded: a wrong name is a usage error; an import that raised shows its traceback
    (with ``--log-format json``, as one record's ``traceback`` field)."""
    if log_format == "json":
        cause = exc.__cause__
        info = (type(cause), cause, cause.__traceback__) if cause is not None else None
        log.error("%s", exc, exc_info=info)
        return EXIT_USAGE if exc.usage else EXIT_FAILURE
    if exc.usage:
        err_console.print(
            f"[bold red]lbs worker: error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        return EXIT_USAGE
    cause = exc.__cause__
    if cause is not None:
        # The application's own frames: the traceback is about its code, not lbs's.
        here = os.path.dirname(__file__)
        tb = cause.__traceback__
        while tb is not None and (
            tb.tb_frame.f_code.co_filename.startswith((here, "<frozen"))
            or "importlib" in tb.tb_frame.f_code.co_filename
        ):
            tb = tb.tb_next
        sys.stderr.write("".join(traceback.format_exception(type(cause), cause, tb)))
    err_console.print(
        f"[bold red]lbs worker: error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
    )
    return EXIT_FAILURE
