"""What an ACL denial means: the rule a user would need, read from Redis's NOPERM reply.

Redis says ``NOPERM User <u> has no permissions to run the '<cmd>' command``
(``+<cmd>``), ``NOPERM No permissions to access a key`` (a ``~pattern``) or ``a
channel`` (a ``&pattern``); lbs's scripts check their inner commands first and
say ``NOPERM lbs <script>: the ACL does not allow <CMD> <key> ...`` (``+<cmd>``).
Both redis-py and lbs's own batches (:mod:`lbs._redis.errors`) raise it as a
``NoPermissionError``; redis-py strips the ``NOPERM`` prefix, lbs keeps it. Both read the same here.
"""

from __future__ import annotations

import re

from redis.exceptions import NoPermissionError

from .errors import classify

__all__ = ["denied_rule"]

_COMMAND = re.compile(r"no permissions to run the '([^']+)' command", re.IGNORECASE)
_SCRIPT = re.compile(r"the ACL does not allow (\S+)")


def denied_rule(exc: BaseException) -> str | None:
    """The ACL rule that would allow what ``exc`` was denied (``+xlen``, ``~<key pattern>``,
    ``&<channel pattern>``), or None when ``exc`` is no ACL denial."""
    message = str(exc)
    if not isinstance(classify(exc), NoPermissionError):
        cause = getattr(exc, "cause", None)  # lbs.RedisOperationError
        return denied_rule(cause) if isinstance(cause, BaseException) else None
    found = _COMMAND.search(message) or _SCRIPT.search(message)
    if found:
        return "+" + found.group(1).lower()
    lowered = message.lower()
    if "access a key" in lowered or "access one of the keys" in lowered:
        return "~<the service's key patterns>"
    if "channel" in lowered:
        return "&<the service's keyspace channel>"
    return "<a rule>"
