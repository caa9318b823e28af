"""lbs: spread work over Redis Streams with exclusive per-stream locks, and never lose it.

Producers register *data streams* in a load-balancer stream (LBS); consumers
of the service's group take them round-robin, each under an exclusive lock.
The documentation starts with the guide, ``docs/index.md``.
"""

from __future__ import annotations

try:
    import _lbscore
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "lbs's compiled core (_lbscore) is missing or was built for another Python. "
        "Install lbs from a wheel, or build it in place with `pip install -e .` "
        "(needs a C compiler; Cython comes from the build requirements). "
        f"Original error: {exc}"
    ) from exc

from _lbscore import decode_input, try_decode_input

from ._keys import INPUT_FIELD, dead_letter_stream, fence_key, group_name, input_stream, lock_key
from .client import Client, ClientStats, Held, consumer_id_from_env
from .config import Config
from .exceptions import (
    BatchError,
    ConfigurationError,
    DataError,
    InterfaceError,
    InternalError,
    InvalidInputError,
    LbsError,
    LockError,
    NotHeldError,
    ProtocolError,
    RedisOperationError,
    ServerError,
    ServerNotFoundError,
    ServerStartError,
)
from .hookspecs import hookimpl
from .notifications import DoneStatus, Notification, NotificationType
from .producer import Producer, encode_input
from .publisher import Publisher
from .keyed import KeyedBatch, KeyedHandler, Message
from .deadletters import DeadLetter, DeadLetterBackend, DeadLetters
from ._redis.connection import ClusterMode
from .strategy import ReadStrategy
from .sharding import ShardedClient, shard_of, shard_services
from .sync import SyncClient

try:
    from importlib.metadata import PackageNotFoundError as _NotFound
    from importlib.metadata import version as _version

    __version__: str = _version("lbs-streams")  # the distribution; the import name is lbs
except _NotFound:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BatchError",
    "ClusterMode",
    "ShardedClient",
    "shard_of",
    "shard_services",
    "DeadLetter",
    "DeadLetterBackend",
    "DeadLetters",
    "ReadStrategy",
    "INPUT_FIELD",
    "Client",
    "ClientStats",
    "Config",
    "ConfigurationError",
    "DataError",
    "DoneStatus",
    "Held",
    "InterfaceError",
    "InternalError",
    "InvalidInputError",
    "LbsError",
    "LockError",
    "NotHeldError",
    "Notification",
    "NotificationType",
    "Producer",
    "Publisher",
    "KeyedBatch",
    "KeyedHandler",
    "Message",
    "ProtocolError",
    "RedisOperationError",
    "ServerError",
    "ServerNotFoundError",
    "ServerStartError",
    "SyncClient",
    "__version__",
    "consumer_id_from_env",
    "dead_letter_stream",
    "decode_input",
    "encode_input",
    "fence_key",
    "group_name",
    "hookimpl",
    "input_stream",
    "lock_key",
    "try_decode_input",
]
