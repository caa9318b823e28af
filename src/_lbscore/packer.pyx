# RESP command encoder.
#
# A command is a RESP array of bulk strings: "*<n>\r\n" then, per argument,
# "$<len>\r\n<bytes>\r\n". Arguments are encoded the way redis-py's Encoder
# does it (bytes as they are, str as UTF-8, int and float through repr(),
# bool refused), so a batch packed here is byte-for-byte what redis-py would
# send for the same commands.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.float cimport PyFloat_CheckExact


cdef int pack_arg(WriteBuffer buf, object value) except -1:
    cdef const char *data
    cdef Py_ssize_t n
    cdef bytes b
    cdef long long v
    cdef int overflow
    if PyBytes_CheckExact(value):
        data = PyBytes_AS_STRING(value)
        n = PyBytes_GET_SIZE(value)
    elif PyUnicode_CheckExact(value):
        # Fails (UnicodeEncodeError) on lone surrogates, as str.encode() does.
        data = PyUnicode_AsUTF8AndSize(value, &n)
    elif PyLong_CheckExact(value) or PyFloat_CheckExact(value):
        if PyLong_CheckExact(value):
            v = PyLong_AsLongLongAndOverflow(value, &overflow)
            if not overflow:
                return buf.write_int(v)  # the digits repr() gives, without a str
        b = repr(value).encode("ascii")
        data = PyBytes_AS_STRING(b)
        n = PyBytes_GET_SIZE(b)
    else:
        b = _encode_slow(value)
        data = PyBytes_AS_STRING(b)
        n = PyBytes_GET_SIZE(b)
    return buf.write_bulk(data, n)


cdef bytes _encode_slow(object value):
    # Subclasses and buffer types: rare, so plain Python is fine here.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool):
        raise _data_error("Invalid input of type: 'bool'. "
                          "Convert to a bytes, string, int or float first.")
    if isinstance(value, (int, float)):
        return repr(value).encode("ascii")
    if isinstance(value, str):
        return (<str>value).encode("utf-8")
    raise _data_error(f"Invalid input of type: '{type(value).__name__}'. "
                      "Convert to a bytes, string, int or float first.")


cdef int pack_into(WriteBuffer buf, object args) except -1:
    cdef tuple targs = tuple(args)
    cdef object first
    if len(targs) == 0:
        raise _data_error("a command needs at least one argument")
    # Like redis-py: a command name such as "CONFIG GET" carries literal
    # arguments, which the server expects as separate bulk strings.
    first = targs[0]
    if isinstance(first, str):
        targs = tuple((<str>first).encode("utf-8").split()) + targs[1:]
    elif isinstance(first, (bytes, bytearray)) and b" " in first:
        targs = tuple(bytes(first).split()) + targs[1:]
    buf.write_len_header(c'*', len(targs))
    for arg in targs:
        pack_arg(buf, arg)
    return 0
