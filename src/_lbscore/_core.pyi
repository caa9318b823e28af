from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

EncodableT = Union[bytes, bytearray, memoryview, str, int, float]

DEBUG_BUILD: bool

def pack_command(*args: EncodableT) -> bytes: ...
def pack_commands(commands: Iterable[Sequence[EncodableT]]) -> bytes: ...
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
        values: list[EncodableT] | None = None,
        append_ids: bool = True,
    ) -> None: ...

class Shape:
    """Where a reply's stream entries are (any other reply is read generically)."""

    ANY: int
    ENTRIES: int
    SCRIPT_ENTRIES: int
    XREAD: int

class _NeedMore: ...

NEED_MORE: _NeedMore

class RespReader:
    """A RESP2/RESP3 reply reader: ``feed`` bytes, ``gets`` replies (or NEED_MORE)."""

    def __init__(self, reply_error: Callable[[str], Any] | None = None) -> None: ...
    def feed(self, data: bytes | bytearray | memoryview) -> None: ...
    def gets(self) -> Any: ...
    def gets_entries(self, parser: EntryParser, shape: int = ...) -> Any: ...
    @property
    def buffered(self) -> int: ...
