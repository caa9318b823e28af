"""Every exception lbs raises, under one root, :class:`LbsError`.

::

    LbsError
    ├── InterfaceError           the API was used wrongly
    │   ├── ConfigurationError   a setting or argument is invalid (also ValueError)
    │   └── DataError            a value cannot be sent to Redis (also TypeError)
    ├── InvalidInputError        an lbs-input value breaks the wire format (also ValueError)
    ├── ServerError              Redis could not be used as lbs needs
    │   ├── ServerNotFoundError  no suitable redis-server binary (embedded servers)
    │   └── ServerStartError     an embedded redis-server did not come up
    └── InternalError            a bug in lbs: an invariant of the core broke
        └── ProtocolError        bytes that are not valid RESP

Errors from redis-py itself (connection refused, timeouts) are not wrapped
here yet; the client issue adds that mapping in one table.
"""

from __future__ import annotations

__all__ = [
    "LbsError",
    "InterfaceError",
    "ConfigurationError",
    "DataError",
    "InvalidInputError",
    "ServerError",
    "ServerNotFoundError",
    "ServerStartError",
    "InternalError",
    "ProtocolError",
]


class LbsError(Exception):
    """Base class of every exception lbs raises."""


class InterfaceError(LbsError):
    """Raised when the lbs API is used in a way it does not support."""


class ConfigurationError(InterfaceError, ValueError):
    """Raised when a setting or an argument has an invalid value."""


class DataError(InterfaceError, TypeError):
    """Raised when a command argument cannot be encoded for Redis."""


class InvalidInputError(LbsError, ValueError):
    """Raised when an ``lbs-input`` value is not ``{"DataStreamName": str, "Info": {...}}``."""


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
