"""One table from Redis's error replies to exception classes, read by the reply's first word.

redis-py does the same in ``BaseParser.EXCEPTION_CLASSES`` (``redis/_parsers/base.py``) for the
replies it knows (NOSCRIPT, LOADING, NOPERM, MOVED, ...), dropping the prefix from the message. lbs's
own batches (:class:`lbs._redis.wire.Wire`) are read by the core's reader, which hands each error
reply to :func:`reply_error`; replies that come back through redis-py (a plain ``ResponseError`` for
the prefixes redis-py does not know: NOGROUP, BUSYGROUP, WRONGTYPE, lbs's scripts' LBSKEY) are
classified through the same table by :func:`classify` (and :func:`replied`,
:func:`lbs._redis.connection.execute`). Either way the message is kept whole, prefix included, so
what is logged and wrapped reads as before; code tells the errors apart by class, never by text.

Every class is a ``redis.exceptions.ResponseError`` (LOADING: ``BusyLoadingError``, a
``ConnectionError``, as redis-py has it), so code catching redis-py's classes keeps working. None is
a caller's mistake: a key of another type, a vanished group, a script not loaded are the state of
the server, and lbs's public API reports them as the ``cause`` of an :class:`lbs.RedisOperationError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Final, TypeVar

from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

__all__ = [
    "ERR_REPLIES",
    "REPLY_ERRORS",
    "BusyGroupError",
    "KeyTypeError",
    "LeaseLostError",
    "NoGroupError",
    "NoSuchKeyError",
    "SlotMovedError",
    "WrongTypeError",
    "classify",
    "replied",
    "reply_error",
]

T = TypeVar("T")


class KeyTypeError(ResponseError):
    """``LBSKEY <key> holds a <type>, not <what it is for>``: a script of lbs (or a reader of lbs's
    keys) found one of the service's keys holding another type, and wrote nothing."""


class LeaseLostError(ResponseError):
    """``LEASE <what the lease key holds>``: a script found the consumer's lease not holding its instance
    nonce (lapsed, or another process's), and wrote nothing: what it would read would be held by nobody."""


class WrongTypeError(ResponseError):
    """``WRONGTYPE``: a command met a key holding another type."""


class NoGroupError(ResponseError):
    """``NOGROUP``: the stream or its consumer group does not exist (deleted, or never created)."""


class BusyGroupError(ResponseError):
    """``BUSYGROUP``: XGROUP CREATE for a group that exists."""


class NoSuchKeyError(ResponseError):
    """``ERR no such key``: XINFO on a stream that does not exist."""


class SlotMovedError(ResponseError):
    """``MOVED`` or ``ASK`` answered to lbs's own batch: another node serves the key's slot, the command
    ran nowhere. (redis-py's ``MovedError``/``AskError`` read the slot and node from a message
    without its prefix; lbs keeps the message whole.)"""


#: Error replies by their first word: the class each becomes, the message kept whole. A first word
#: not here (and ``ERR`` not in :data:`ERR_REPLIES`) is a plain ``ResponseError``.
REPLY_ERRORS: Final[Mapping[str, type[RedisError]]] = {
    # a script not loaded (a restart, a failover): the wire loads them and sends again
    "NOSCRIPT": NoScriptError,
    # a restarted Redis loading its data set: "not yet", like a refused connection
    "LOADING": BusyLoadingError,
    # an ACL denial; lbs's scripts say "NOPERM lbs <script>: ..." (lbs._redis.acl reads the rule)
    "NOPERM": NoPermissionError,
    # lbs's scripts and readers: a key of the service holds another type
    "LBSKEY": KeyTypeError,
    # the take and read-3: the consumer's lease does not hold its nonce (the heartbeat takes it again)
    "LEASE": LeaseLostError,
    "WRONGTYPE": WrongTypeError,
    "NOGROUP": NoGroupError,
    "BUSYGROUP": BusyGroupError,
    # a node that does not (or cannot now) serve the slot: the command ran nowhere
    "MOVED": SlotMovedError,
    "ASK": SlotMovedError,
    "READONLY": ReadOnlyError,
    "CLUSTERDOWN": ClusterDownError,
    "MASTERDOWN": MasterDownError,
    "TRYAGAIN": TryAgainError,
}

#: ``ERR`` replies told apart by their whole text after ``ERR `` (redis-py's table does the same).
ERR_REPLIES: Final[Mapping[str, type[ResponseError]]] = {
    "no such key": NoSuchKeyError,
}

#: How redis-py rewrites the message of a pipeline's failed command:
#: ``Command # <n> (<command>) of pipeline caused error: ('<reply>',)``.
_PIPELINE_NOTE = " of pipeline caused error: "


def reply_error(message: str) -> RedisError:
    """The exception for an error reply as Redis sent it (the wire's reader): the class
    :data:`REPLY_ERRORS` has for its first word, else ``ResponseError``; the message whole."""
    return (_class_of(message) or ResponseError)(message)


def _class_of(message: str) -> type[RedisError] | None:
    """The table's class for an error reply's text, as Redis sent it or as redis-py passed it on
    (``ERR`` dropped, or inside a pipeline's note); None: not in the table."""
    if message.startswith("Command # ") and _PIPELINE_NOTE in message:
        message = message.split(_PIPELINE_NOTE, 1)[1].lstrip("(\"'")
    code, _, rest = message.partition(" ")
    if code == "ERR":
        return ERR_REPLIES.get(rest)
    return REPLY_ERRORS.get(code) or ERR_REPLIES.get(message)  # redis-py drops "ERR "


def classify(exc: BaseException) -> BaseException:
    """A ``ResponseError`` as redis-py raised or returned it, as the table's class for its reply
    (the same message, traceback and cause); anything else (redis-py's own classes included)
    unchanged. Only ``ResponseError`` subclasses are handed out, so ``except ResponseError`` holds."""
    if type(exc) is not ResponseError:
        return exc
    cls = _class_of(str(exc))
    if cls is None or not issubclass(cls, ResponseError):
        return exc
    out = cls(*exc.args)
    out.__cause__, out.__context__ = exc.__cause__, exc.__context__
    out.__suppress_context__ = exc.__suppress_context__
    return out.with_traceback(exc.__traceback__)


async def replied(call: Awaitable[T]) -> T:
    """Await a redis-py command; a ``ResponseError`` it raises comes out as :func:`classify` has it."""
    try:
        return await call
    except ResponseError as exc:
        out = classify(exc)
        if out is exc:
            raise
    raise out  # outside the handler: the original's own cause and context, not the original
