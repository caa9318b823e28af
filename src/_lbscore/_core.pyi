import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

EncodableT = bytes | bytearray | memoryview | str | int | float
_Encodable = TypeVar("_Encodable", bound=EncodableT)  # a list of any one kind of argument

DEBUG_BUILD: bool

def use_errors(
    *,
    data_error: type[Exception],
    invalid_input: type[Exception],
    internal_error: type[Exception],
    protocol_error: type[Exception],
) -> None: ...

class ReplyError(Exception):
    """An error reply, as a RespReader made without a ``reply_error`` factory returns it."""

def encode_input(name: str, info: dict[str, Any] | None = None) -> bytes: ...
def decode_input(raw: bytes | str) -> tuple[str, dict[str, Any]]: ...
def try_decode_input(
    raw: bytes | bytearray | memoryview | str | None,
) -> tuple[str, dict[str, Any], None] | tuple[None, None, str]: ...

class Entry:
    """One LBS entry; ``error`` is the reason when it is not a valid assignment."""

    id: str
    stream: str | None
    info: dict[str, Any] | None
    retry_count: int
    original_id: str | None
    error: str | None
    fields: dict[bytes, bytes]
    idle_ms: int
    delivery_count: int
    @property
    def ok(self) -> bool: ...
    @property
    def claimed(self) -> bool: ...

class Message:
    """One message of a key's data stream: its ``id`` (ids only grow: the order of the key) and
    its ``fields``, decoded as UTF-8 (invalid bytes replaced) when first read."""

    id: str
    """The message's id in the key's data stream."""
    def __init__(self, id: str, fields: Mapping[str, str] | None = None) -> None: ...
    @property
    def fields(self) -> dict[str, str]: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: None  # type: ignore[assignment]

def messages_of(reply: Any) -> list[Message]: ...

class EntryParser:
    def __init__(
        self,
        input_field: str = "lbs-input",
        retry_field: str = "_retry_count",
        original_field: str = "_original_id",
        max_input_bytes: int = 65536,
    ) -> None: ...
    def parse_entries(self, entries: Iterable[Sequence[Any]]) -> list[Entry]: ...
    def parse_xreadgroup(self, reply: Any) -> list[Entry]: ...

class Held:
    """A stream this client holds: its entry, its lock and the lock's value.

    ``value`` and ``lock_key`` are computed from the token, the consumer id
    and the lock key prefix; the constructor checks that the ones given agree.
    """

    def __init__(
        self,
        entry_id: str,
        stream: str,
        info: dict[str, Any] | None,
        retry_count: int,
        token: int,
        value: str,
        lock_key: str,
        task: asyncio.Task[Any] | None = None,
    ) -> None: ...
    @property
    def entry_id(self) -> str:
        """The assignment's entry id in the LBS."""
    @property
    def stream(self) -> str:
        """The data stream's name."""
    @property
    def info(self) -> dict[str, Any]: ...
    @property
    def retry_count(self) -> int:
        """Failed attempts so far (``_retry_count``)."""
    @property
    def token(self) -> int:
        """The lock's fencing token."""
    @property
    def fields(self) -> dict[bytes, bytes]:
        """The entry's fields when it has some beyond lbs's own (a trace context), else ``{}``."""
    @property
    def value(self) -> str: ...
    @property
    def lock_key(self) -> str: ...
    @property
    def running(self) -> bool:
        """Whether the application has it (recovery counts its holder's death against it)."""
    def start(self) -> bool:
        """The application took it; True if Redis has to be told."""
    @property
    def taken_at(self) -> float:
        """When it was taken: the client's monotonic clock, in seconds."""
    task: asyncio.Task[Any] | None

class HeldTable:
    """The streams one client holds, by entry id and by stream name."""

    def __init__(self, consumer_id: str, lock_prefix: str) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, entry_id: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __bool__(self) -> bool: ...
    def take(
        self, entry: Entry, token: int, retry_count: int, taken_at: float, queued: bool = False
    ) -> Held: ...
    @staticmethod
    def pending_marks(held: list[Held]) -> list[str]: ...
    @staticmethod
    def settle_marks(held: list[Held]) -> None: ...
    def taken_before(self, cutoff: float) -> list[Held]: ...
    def add(self, h: Held) -> None: ...
    def drop(self, h: Held) -> bool: ...
    def get(self, entry_id: str, default: Held | None = None) -> Held | None: ...
    def find(self, stream: str, entry_id: str | None = None) -> Held | None: ...
    def for_stream(self, stream: str) -> list[Held]: ...
    def values(self) -> list[Held]: ...

class CommandBatch:
    """Commands encoded into one RESP buffer: one write, ``len(batch)`` replies."""

    def __init__(self, initial: int = 4096) -> None: ...
    def __len__(self) -> int: ...
    def getvalue(self) -> bytes: ...
    def clear(self) -> None: ...
    def command(self, *args: EncodableT) -> None: ...
    def expect(self, shape: int) -> None: ...
    @property
    def expects_entries(self) -> bool: ...
    def reply_shape(self, index: int) -> int: ...
    def evalsha_locks(
        self,
        sha: EncodableT,
        head_keys: tuple[EncodableT, ...],
        lock_prefix: bytes,
        entry_ids: list[str] | list[bytes],
        head_args: tuple[EncodableT, ...],
        values: list[_Encodable] | None = None,
        append_ids: bool = True,
        tail: list[_Encodable] | None = None,
        names: list[str] | None = None,
        name_prefix: bytes = b"",
        lock_keys: bool = True,
    ) -> None: ...

class Shape:
    """Where a reply's stream entries are (any other reply is read generically)."""

    ANY: int
    ENTRIES: int
    SCRIPT_ENTRIES: int
    XREAD: int
    MESSAGES: int

class _NeedMore: ...

NEED_MORE: _NeedMore

class RespReader:
    """A RESP2/RESP3 reply reader: ``feed`` bytes, ``gets`` replies (or NEED_MORE)."""

    def __init__(self, reply_error: Callable[[str], Any] | None = None) -> None: ...
    def feed(self, data: bytes | bytearray | memoryview) -> None: ...
    def gets(self) -> Any: ...
    def gets_entries(self, parser: EntryParser | None, shape: int = ...) -> Any: ...

class XaddRoute:
    """Where one data stream's rows go (its node's batch) and its IDMP chunking."""

    batch: CommandBatch
    stream: str
    size: int
    pid_prefix: bytes
    count: int
    def __init__(
        self, batch: CommandBatch, stream: str, size: int = 0, pid_prefix: bytes = b""
    ) -> None: ...

def encode_xadds(
    streams: list[Any],
    names: list[str],
    columns: list[list[Any]],
    routes: dict[Any, XaddRoute],
    start: int = 0,
    stop: int = -1,
) -> int: ...

class EntryColumns:
    """Stream entries as Arrow-ready buffers: ids, and fields as a map of strings."""

    passed: bool
    last_id: bytes | None
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def bound(self, end: str | bytes | None) -> None: ...
    def read(self, reader: RespReader, shape: int = ...) -> int | _NeedMore: ...
    def take(self) -> tuple[int, int, bytes, bytes, bytes, bytes, bytes, bytes, bytes]: ...
