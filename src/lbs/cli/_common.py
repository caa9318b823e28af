"""What every ``lbs`` command shares: exit codes, the stderr console, errors, logging, URL masking."""

from __future__ import annotations

import logging
import ssl
import sys
from typing import NoReturn

import typer
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console
from rich.markup import escape

from .._urlmask import mask_url

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "err_console",
    "explain",
    "fail",
    "mask_url",
    "setup_logging",
]

#: A clean stop: the work ended, or a signal's drain and hand-back finished.
EXIT_OK = 0
#: A failure at run time: Redis unreachable, a refused start, an lbs error.
EXIT_FAILURE = 1
#: The command line itself is wrong (click's usage errors, a bad MODULE:HANDLER).
EXIT_USAGE = 2
#: A setting is invalid, wherever it came from (a file, LBS_<FIELD>, --set, a flag): sysexits' EX_CONFIG.
EXIT_CONFIG = 78

#: Messages, banners and logs go to stderr; stdout carries only what a command is asked to print.
err_console = Console(stderr=True)


def fail(command: str, message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``lbs <command>: error: <message>`` to stderr and exit with ``code`` (no traceback)."""
    err_console.print(
        f"[bold red]lbs {command}: error:[/] {escape(message)}", highlight=False, soft_wrap=True
    )
    raise typer.Exit(code)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (``lbs.RedisOperationError.cause``, ``__cause__``, ``__context__``)."""
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in out and len(out) < 8:
        out.append(seen)
        seen = getattr(seen, "cause", None) or seen.__cause__ or seen.__context__
    return out


def explain(exc: BaseException, url: str = "") -> str:
    """``exc`` as one line, with the fix when the URL made the usual mistakes: no password (redis-py
    says "HELLO must be called..."), a wrong one, TLS (``rediss://``) against a plain port (a timeout)
    or a plain URL against a TLS port (the server hangs up)."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain)
    tls = url.lower().startswith("rediss")
    shown = mask_url(url) if url else "the URL"
    if (
        any(isinstance(e, AuthenticationError) for e in chain)
        or "NOAUTH" in text
        or "WRONGPASS" in text
    ):
        if "HELLO must be called" in text or "NOAUTH" in text or "Authentication required" in text:
            return (
                f"the server wants a password and {shown} has none: put it in the URL, "
                "redis://:PASSWORD@HOST:PORT (an ACL user: redis://USER:PASSWORD@HOST:PORT)"
            )
        return (
            f"the server refused the user or password of {shown} (WRONGPASS): check them "
            "(redis://USER:PASSWORD@HOST:PORT)"
        )
    if any(isinstance(e, ssl.SSLError) for e in chain) or (
        tls and any(isinstance(e, (RedisTimeoutError, TimeoutError)) for e in chain)
    ):
        return (
            f"no TLS handshake with {shown} ({exc}): if the server does not speak TLS on that port, use "
            "redis:// (rediss:// is for TLS; a CA of your own goes in ?ssl_ca_certs=PATH)"
        )
    if (
        not tls
        and url
        and any(isinstance(e, RedisConnectionError) for e in chain)
        and ("closed by server" in text or "Connection reset" in text)
    ):
        return f"{exc} (if the server speaks TLS on that port, use rediss://)"
    return str(exc)


def setup_logging(level: str) -> None:
    """Log records to stderr: through rich on a terminal, one plain line per record otherwise (a service's log)."""
    handler: logging.Handler
    if err_console.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
