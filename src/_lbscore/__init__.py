"""Compiled core of lbs (private: use the ``lbs`` package).

Everything here lives in one extension module, ``_lbscore._core``; this
package only re-exports it.
"""

from ._core import (
    DEBUG_BUILD,
    NEED_MORE,
    CommandBatch,
    Entry,
    EntryColumns,
    EntryParser,
    Held,
    HeldTable,
    Message,
    ReplyError,
    RespReader,
    Shape,
    XaddRoute,
    decode_input,
    encode_input,
    encode_xadds,
    messages_of,
    try_decode_input,
    use_errors,
)

__all__ = [
    "DEBUG_BUILD",
    "NEED_MORE",
    "CommandBatch",
    "Entry",
    "EntryColumns",
    "EntryParser",
    "Held",
    "HeldTable",
    "Message",
    "ReplyError",
    "RespReader",
    "Shape",
    "XaddRoute",
    "decode_input",
    "encode_input",
    "encode_xadds",
    "messages_of",
    "try_decode_input",
    "use_errors",
]
