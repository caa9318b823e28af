"""A Redis URL fit to print: its secrets (a password, a user-only secret, a ``password=`` option)
replaced by ``***``. The one copy behind every message that shows a URL (the library's errors, the
``lbs`` command's output). A ``redis+sentinel://`` URL's master password (before its hosts) and
its ``sentinel_password=`` option are masked the same way."""

from __future__ import annotations

import re

__all__ = ["mask_secrets", "mask_url"]

_PASSWORD_OPTION = re.compile(r"(?i)([?&](?:sentinel_)?password=)([^&#]*)")


def _split(url: str) -> tuple[str, str, str]:
    """``(scheme://, netloc, the rest)``; a URL without a scheme is all netloc and path."""
    scheme, sep, rest = url.partition("://")
    head = scheme + sep if sep else ""
    rest = rest if sep else url
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return head, rest[:cut], rest[cut:]


def mask_url(url: str) -> str:
    """``url`` with its secrets replaced by ``***``: ``user:***@host``, ``***@host`` (a user-only
    secret), ``password=***`` (``sentinel_password=***``); the rest as written."""
    head, netloc, tail = _split(url)
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else f"***@{host}"
    return head + netloc + _PASSWORD_OPTION.sub(r"\1***", tail)


def mask_secrets(url: str, message: str) -> str:
    """``message`` (an error that may quote ``url`` or parts of it) with ``url``'s secrets replaced
    by ``***``; a secret shorter than 4 characters is left (replacing it would garble the message
    more than it hides)."""
    _, netloc, tail = _split(url)
    secrets = [m.group(2) for m in _PASSWORD_OPTION.finditer(tail)]
    if "@" in netloc:
        user, colon, password = netloc.rsplit("@", 1)[0].partition(":")
        secrets.insert(0, password if colon else user)
    for secret in secrets:
        if len(secret) >= 4:
            message = message.replace(secret, "***")
    return message
