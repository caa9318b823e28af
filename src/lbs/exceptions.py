"""Every exception lbs raises, under one root, :class:`LbsError`.

::

    LbsError
    ├── InterfaceError           the API was used wrongly
    │   ├── ConfigurationError   a setting or argument is invalid (also ValueError)
    │   ├── DataError            a value cannot be sent to Redis (also TypeError)
    │   └── NoSuchServiceError   an operator's tool was given a service Redis does not have (also LookupError)
    ├── InvalidInputError        an lbs-input value breaks the wire format (also ValueError)
    ├── LockError                an assignment is not (or no longer) held by this client
    │   └── NotHeldError         done/hand-back for a stream this client never held
    ├── RedisOperationError      a Redis command of lbs failed (carries operation and cause)
    │   └── BatchError           part of a batch failed: which entries were written, which are unknown
    ├── ServerError              Redis could not be used as lbs needs
    │   ├── ServerNotFoundError  no suitable redis-server binary (embedded servers)
    │   └── ServerStartError     an embedded redis-server did not come up
    └── InternalError            a bug in lbs: an invariant of the core broke
        └── ProtocolError        bytes that are not valid RESP

The Go client's sentinel errors map onto these: config -> ConfigurationError,
input -> InvalidInputError, lock -> LockError, redis operation ->
RedisOperationError. Errors of redis-py raised inside a client operation are
wrapped in RedisOperationError, with the redis-py exception as ``cause``
(and ``__cause__``). Redis's error replies are classified by one table,
``lbs._redis.errors`` (NOGROUP, WRONGTYPE, lbs's scripts' LBSKEY ...: subclasses
of redis-py's ResponseError, the server's message kept whole).
"""

from __future__ import annotations

__all__ = [
    "BatchError",
    "ConfigurationError",
    "DataError",
    "InterfaceError",
    "InternalError",
    "InvalidInputError",
    "LbsError",
    "LockError",
    "NoSuchServiceError",
    "NotHeldError",
    "ProtocolError",
    "RedisOperationError",
    "ServerError",
    "ServerNotFoundError",
    "ServerStartError",
]


class LbsError(Exception):
    """Base class of every exception lbs raises."""


class InterfaceError(LbsError):
    """Raised when the lbs API is used in a way it does not support."""


class ConfigurationError(InterfaceError, ValueError):
    """Raised when a setting or an argument has an invalid value."""


class DataError(InterfaceError, TypeError):
    """Raised when a command argument cannot be encoded for Redis."""


class NoSuchServiceError(InterfaceError, LookupError):
    """Raised when an operator's tool (``lbs status``, ``lbs dlq``, ``lbs claim``, the dashboard) is
    given a service whose load-balancer stream does not exist on that Redis: a mistyped name.

    The message names the Redis (its URL masked) and the closest existing services
    (:attr:`suggestions`), or those there are; :attr:`service` is the name given.
    """

    def __init__(self, message: str, service: str = "", suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.service = service
        self.suggestions = tuple(suggestions)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.service, self.suggestions))


class InvalidInputError(LbsError, ValueError):
    """Raised when an ``lbs-input`` value is not ``{"DataStreamName": str, "Info": {...}}``."""


class LockError(LbsError):
    """Raised when an assignment is not, or no longer, held by this client (under its lease).

    The name is the Go client's (its sentinel lock error); lbs holds assignments by the consumer's
    lease, not by a lock per entry.
    """


class NotHeldError(LockError, InterfaceError):
    """Raised when a client is asked to finish or hand back a stream it does not hold."""


class RedisOperationError(LbsError):
    """Raised when a Redis command issued by lbs fails; ``operation`` says which, ``cause`` why."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(f"{operation} failed: {type(cause).__name__}: {cause}")
        self.operation = operation
        self.cause = cause


class BatchError(RedisOperationError):
    """Raised when a batch (``Producer.add_streams``) failed in part or in whole.

    ``entry_ids`` is aligned with the batch's input order: the entry id where
    the entry was registered, ``None`` where it was not (or may not have
    been). ``unknown`` lists the positions whose outcome is unknown: the
    connection failed after the batch was sent, so they may or may not have
    been registered. ``cause`` is the first failure, in input order.
    """

    def __init__(
        self,
        operation: str,
        cause: BaseException,
        entry_ids: list[str | None],
        unknown: list[int] | None = None,
    ) -> None:
        super().__init__(operation, cause)
        self.entry_ids = list(entry_ids)
        self.unknown = list(unknown or ())
        written = sum(i is not None for i in self.entry_ids)
        unknown_note = f", {len(self.unknown)} unknown" if self.unknown else ""
        self.args = (
            f"{operation} failed: {written} of {len(self.entry_ids)} registered{unknown_note}: "
            f"{type(cause).__name__}: {cause}",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.operation, self.cause, self.entry_ids, self.unknown))


class ServerError(LbsError):
    """Raised when Redis cannot be used the way lbs needs it."""


class ServerNotFoundError(ServerError):
    """Raised when no redis-server binary of the required version can be found."""


class ServerStartError(ServerError):
    """Raised when an embedded redis-server exits or stays unreachable at start."""


class InternalError(LbsError):
    """Raised when an internal invariant breaks: always a bug in lbs, please report it."""


class ProtocolError(InternalError):
    """Raised when bytes from the server are not valid RESP."""


# The compiled core raises these types but imports nothing from lbs: hand
# them in now, so no core error can reach a user of lbs as a built-in type.
import _lbscore  # noqa: E402 - after the classes it is handed

_lbscore.use_errors(
    data_error=DataError,
    invalid_input=InvalidInputError,
    internal_error=InternalError,
    protocol_error=ProtocolError,
)
