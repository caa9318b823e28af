# XADD commands encoded straight from columns, for the Spark sink.
#
# A partition arrives as Arrow record batches; the sink turns each column into
# a Python list once (Arrow's C conversion) and hands the lists here. One C loop
# per batch writes every row's XADD into the CommandBatch of the node that owns
# the row's stream: no per-row Python call, tuple or redis-py pipeline object.
#
# With XADD IDMP (Redis >= 8.6) every row gets the producer id
# "<prefix><chunk>" and the entry id "<index in chunk>", where a stream's rows
# are counted from 0 in the order they arrive and a chunk holds `size` rows:
# the same rows in the same order give the same ids, so a retried task's rows
# return their first entries instead of adding new ones.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_CheckExact


cdef class XaddRoute:
    """Where one data stream's rows go, and how far its row count has got.

    ``batch`` is the CommandBatch of the node owning the stream; ``size`` the
    rows per IDMP producer id (0: no IDMP); ``pid_prefix`` the producer id
    before the chunk number; ``count`` the stream's rows encoded so far.
    """

    def __init__(self, CommandBatch batch not None, stream, Py_ssize_t size=0, bytes pid_prefix=b""):
        if size < 0:
            raise _data_error(f"an IDMP chunk size must be >= 0, got {size}")
        self.batch = batch
        self.stream = stream
        self.size = size
        self.pid_prefix = pid_prefix
        self.count = 0


cdef bytes _EMPTY_FIELD = b"_empty"
cdef bytes _EMPTY = b""


cdef inline int _pack_value(WriteBuffer buf, object value) except -1:
    if PyUnicode_CheckExact(value) or PyBytes_CheckExact(value):
        return pack_arg(buf, value)
    if isinstance(value, bool):  # str(), as the rows of a DataFrame print it
        return pack_arg(buf, "True" if value else "False")
    if isinstance(value, (int, float, bytes, bytearray, memoryview)):
        return pack_arg(buf, value)
    return pack_arg(buf, str(value))


def encode_xadds(list streams, list names, list columns, dict routes, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """Encode ``XADD <stream> [IDMP <pid> <iid>] * <name> <value> ...`` for every row.

    ``streams[i]`` names row i's stream (None: the row is skipped);
    ``columns[j][i]`` is its value for field ``names[j]`` (None: left out; a
    row with no values gets the field ``_empty``). ``routes`` maps every
    stream name to its :class:`XaddRoute`. Only rows ``start`` to ``stop``
    (exclusive; -1: the end) are encoded. Returns the number of rows encoded.
    """
    cdef Py_ssize_t nrows = len(streams)
    cdef Py_ssize_t ncols = len(names)
    cdef Py_ssize_t i, j, nfields, n
    cdef char digits[INT64_DIGITS]
    cdef XaddRoute route
    cdef WriteBuffer buf
    cdef object stream, value
    cdef Py_ssize_t written = 0
    if len(columns) != ncols:
        raise _data_error(f"{len(columns)} columns for {ncols} field names")
    for j in range(ncols):
        if len(<list>columns[j]) != nrows:
            raise _data_error(f"column {names[j]!r} has {len(<list>columns[j])} values for {nrows} rows")
    if stop < 0 or stop > nrows:
        stop = nrows
    for i in range(max(start, 0), stop):
        stream = streams[i]
        if stream is None:
            continue
        route = <XaddRoute?>routes[stream]
        if route.size and route.pid_prefix is None:
            raise _data_error(f"the route of {stream!r} has IDMP chunks but no pid_prefix")
        buf = route.batch.buffer()
        nfields = 0
        for j in range(ncols):
            if (<list>columns[j])[i] is not None:
                nfields += 1
        buf.write_len_header(c'*', 3 + 2 * (nfields if nfields else 1) + (3 if route.size else 0))
        pack_arg(buf, b"XADD")
        pack_arg(buf, stream)
        if route.size:
            n = route.count
            pack_arg(buf, b"IDMP")
            buf.write_bulk2(PyBytes_AS_STRING(route.pid_prefix), PyBytes_GET_SIZE(route.pid_prefix),
                            digits, format_int64(n // route.size, digits))  # <prefix><chunk>
            buf.write_int(n % route.size)
        pack_arg(buf, b"*")
        if nfields == 0:
            pack_arg(buf, _EMPTY_FIELD)
            pack_arg(buf, _EMPTY)
        else:
            for j in range(ncols):
                value = (<list>columns[j])[i]
                if value is not None:
                    pack_arg(buf, names[j])
                    _pack_value(buf, value)
        route.count += 1
        route.batch.command_written()
        written += 1
    return written
