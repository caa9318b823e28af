"""Compiled core of lbs (private: use the ``lbs`` package).

Everything here lives in one extension module, ``_lbscore._core``; this
package only re-exports it.
"""

from ._core import (
    CommandBatch,
    DEBUG_BUILD,
    Held,
    HeldTable,
    Entry,
    EntryColumns,
    EntryParser,
    Message,
    NEED_MORE,
    ReplyError,
    RespReader,
    Shape,
    decode_input,
    encode_input,
    messages_of,
    pack_command,
    pack_commands,
    try_decode_input,
    use_errors,
    XaddRoute,
    encode_xadds,
)

__all__ = [
    "CommandBatch",
    "DEBUG_BUILD",
    "Held",
    "HeldTable",
    "Entry",
    "EntryColumns",
    "EntryParser",
    "Message",
    "NEED_MORE",
    "ReplyError",
    "RespReader",
    "Shape",
    "decode_input",
    "encode_input",
    "messages_of",
    "pack_command",
    "pack_commands",
    "try_decode_input",
    "use_errors",
    "XaddRoute",
    "encode_xadds",
]
