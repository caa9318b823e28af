"""lbs: spread work over Redis Streams with exclusive per-stream locks, and never lose it.

Producers register *data streams* in a load-balancer stream (LBS); consumers
of the service's group take them round-robin, each held by one consumer at a time (under that
consumer's lease).
The documentation starts with the guide, ``docs/index.md``.
"""

from __future__ import annotations

try:
    import _lbscore  # noqa: F401 (fail here, with the message below, if the core is missing)
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "lbs's compiled core (_lbscore) is missing or was built for another Python. "
        "Install lbs from a wheel, or build it in place with `pip install -e .` "
        "(needs a C compiler; Cython comes from the build requirements). "
        f"Original error: {exc}"
    ) from exc

from _lbscore import decode_input, try_decode_input

from ._keys import INPUT_FIELD, dead_letter_stream, fence_key, group_name, input_stream, lease_key
from ._redis.connection import ClusterMode
from .client import Client, ClientStats, Held, consumer_id_from_env
from .config import Config
from .controls import ControlOutcome, PauseState, ServiceControls
from .deadletters import DeadLetter, DeadLetterBackend, DeadLetters
from .exceptions import (
    BatchError,
    ConfigurationError,
    DataError,
    InterfaceError,
    InternalError,
    InvalidInputError,
    LbsError,
    LockError,
    NoSuchServiceError,
    NotHeldError,
    ProtocolError,
    RedisOperationError,
    ServerError,
    ServerNotFoundError,
    ServerStartError,
)
from .hookspecs import hookimpl
from .keyed import KeyedBatch, KeyedHandler, Message
from .notifications import DoneStatus, Notification, NotificationType
from .producer import Producer, encode_input
from .publisher import Publisher
from .sharding import ShardedClient, shard_of, shard_services
from .strategy import ReadStrategy
from .sync import SyncClient

try:
    from importlib.metadata import PackageNotFoundError as _NotFound
    from importlib.metadata import version as _version

    __version__: str = _version("lbs-streams")  # the distribution; the import name is lbs
except _NotFound:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "INPUT_FIELD",
    "BatchError",
    "Client",
    "ClientStats",
    "ClusterMode",
    "Config",
    "ConfigurationError",
    "ControlOutcome",
    "DataError",
    "DeadLetter",
    "DeadLetterBackend",
    "DeadLetters",
    "DoneStatus",
    "Held",
    "InterfaceError",
    "InternalError",
    "InvalidInputError",
    "KeyedBatch",
    "KeyedHandler",
    "LbsError",
    "LockError",
    "Message",
    "NoSuchServiceError",
    "NotHeldError",
    "Notification",
    "NotificationType",
    "PauseState",
    "Producer",
    "ProtocolError",
    "Publisher",
    "ReadStrategy",
    "RedisOperationError",
    "ServerError",
    "ServerNotFoundError",
    "ServerStartError",
    "ServiceControls",
    "ShardedClient",
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
    "lease_key",
    "shard_of",
    "shard_services",
    "try_decode_input",
]
