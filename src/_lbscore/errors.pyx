# The exceptions the core raises. The core imports nothing from lbs (nor
# from redis): lbs hands its own types in through use_errors when it is
# imported (lbs/exceptions.py), so every error a user of lbs sees from the
# core is an lbs.LbsError. Until then built-in types stand in, and the
# core works on its own.

cdef object _DataError = ValueError
cdef object _InvalidInputError = ValueError
cdef object _InternalError = RuntimeError
cdef object _ProtocolError = RuntimeError


def use_errors(*, data_error, invalid_input, internal_error, protocol_error):
    """Raise these exception types from now on (lbs calls this when it is imported).

    ``data_error``: an argument cannot be encoded for Redis; ``invalid_input``:
    an ``lbs-input`` value breaks the wire format; ``internal_error``: an
    invariant of the core broke; ``protocol_error``: bytes that are not RESP.
    Each is called with the message.
    """
    global _DataError, _InvalidInputError, _InternalError, _ProtocolError
    for kind in (data_error, invalid_input, internal_error, protocol_error):
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise TypeError(f"use_errors takes exception classes, got {kind!r}")
    _DataError = data_error
    _InvalidInputError = invalid_input
    _InternalError = internal_error
    _ProtocolError = protocol_error


class ReplyError(Exception):
    """An error reply, as a RespReader made without a ``reply_error`` factory returns it."""


cdef object _data_error(str message):
    return _DataError(message)


cdef object _invalid_input(str message):
    return _InvalidInputError(message)


cdef object _protocol_error(str message):
    return _ProtocolError(message)


cdef int _internal_error(str message) except -1:
    raise _InternalError(message)
