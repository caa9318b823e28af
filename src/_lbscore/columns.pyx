# Stream entries read straight into column buffers, for the Spark readers.
#
# An XRANGE or XREADGROUP reply checked whole by the RespReader is walked in
# place: each entry's id and its field names and values are copied into
# Arrow's layout for string columns (one data buffer, int32 offsets) and a
# map column (int32 offsets into the key and value columns). No Python object
# is made per entry or per value; lbs/spark/_read.py wraps the buffers in
# pyarrow arrays without copying them again.
#
# A bound (an entry id) stops a read at the end of a micro-batch: entries
# after it are counted as seen but not added, and `passed` says one was met.

from libc.stdint cimport int32_t


cdef inline int _offset(WriteBuffer offsets, Py_ssize_t value) except -1:
    cdef int32_t v
    if value > 0x7fffffff:
        raise _data_error("a column of entries grew past 2 GiB: read smaller pages")
    v = <int32_t>value
    return offsets.write(<const char *>&v, 4)


cdef class EntryColumns:
    """Stream entries as Arrow-ready buffers: ids, and fields as a map of strings.

    ``read(reader, shape)`` takes the next whole reply of a RespReader
    (``Shape.ENTRIES``: XRANGE; ``Shape.XREAD``: XREADGROUP of one stream)
    and appends its entries; ``take()`` returns the buffers and starts
    afresh. Deleted entries (nil fields, in a pending-entries read) and
    entries after ``bound`` are left out but counted as seen.
    """

    def __cinit__(self):
        self._ids = WriteBuffer(1 << 15)
        self._id_off = WriteBuffer(1 << 13)
        self._keys = WriteBuffer(1 << 15)
        self._key_off = WriteBuffer(1 << 14)
        self._vals = WriteBuffer(1 << 16)
        self._val_off = WriteBuffer(1 << 14)
        self._map_off = WriteBuffer(1 << 13)
        self._bounded = False
        self.passed = False
        self.last_id = None
        self._reset()

    cdef int _reset(self) except -1:
        cdef WriteBuffer offsets
        self._ids.clear()
        self._keys.clear()
        self._vals.clear()
        self._rows = self._pairs = 0
        for offsets in (self._id_off, self._key_off, self._val_off, self._map_off):
            offsets.clear()
            _offset(offsets, 0)  # each column's first offset
        return 0

    def __len__(self):
        return self._rows

    def bound(self, end):
        """Leave out entries after id ``end`` (None: no bound); resets ``passed``."""
        cdef bytes b
        self.passed = False
        if end is None:
            self._bounded = False
            return
        b = end.encode() if isinstance(end, str) else bytes(end)
        if stream_id_parts(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), &self._end_ms, &self._end_seq) < 0:
            raise _data_error(f"not a stream entry id: {end!r}")
        self._bounded = True

    def read(self, RespReader reader not None, int shape=SHAPE_ENTRIES):
        """Append the entries of the reader's next whole reply.

        Returns how many entries the reply held (those left out included),
        or NEED_MORE. An error reply is raised (the reader's error type).
        """
        cdef Py_ssize_t pos, seen = 0, le
        cdef long long n, k
        cdef const char *p
        cdef char t
        if shape != SHAPE_ENTRIES and shape != SHAPE_XREAD:
            raise _data_error(f"EntryColumns reads Shape.ENTRIES or Shape.XREAD replies, not {shape}")
        pos = reader.next_reply()
        if pos < 0:
            return _NEED_MORE
        p = reader.data()
        try:
            t = p[pos]
            if t == 45 or t == 33:  # - !  an error reply
                raise reader.value_at(&pos)
            if t == 95 or (t == 42 and p[pos + 1] == 45):  # _ or *-1: nil, nothing to read
                return 0
            if shape == SHAPE_ENTRIES:
                if t != 42:
                    raise _layout(reader.value_at(&pos))
                return self._entries(reader, &pos)
            if t != 42 and t != 37:
                raise _layout(reader.value_at(&pos))
            le = _crlf(p, pos + 1, reader.data_end())
            n = trusted_int(p, pos + 1, le)
            pos = le + 2
            for k in range(n):
                if t == 42:  # RESP2: [stream, entries]
                    if p[pos] != 42 or p[pos + 1] != 50 or p[pos + 2] != 13:
                        raise _layout(reader.value_at(&pos))
                    pos += 4
                reader.value_at(&pos)  # the stream's name
                if p[pos] == 42 and p[pos + 1] != 45:
                    seen += self._entries(reader, &pos)
                else:
                    reader.value_at(&pos)
            return seen
        finally:
            reader.consume()

    cdef Py_ssize_t _entries(self, RespReader reader, Py_ssize_t *at) except -1:
        # p[at] is '*': an array of [id, fields] entries.
        cdef const char *p = reader.data()
        cdef Py_ssize_t end = reader.data_end(), pos = at[0], le, idn, vl, idp
        cdef long long n, m, k, j
        cdef unsigned long long ms = 0, seq = 0
        cdef bint take
        le = _crlf(p, pos + 1, end)
        n = trusted_int(p, pos + 1, le)
        pos = le + 2
        for k in range(n):
            if p[pos] != 42 or p[pos + 1] != 50 or p[pos + 2] != 13 or p[pos + 4] != 36:
                raise _layout(reader.value_at(&pos))
            pos += 4
            le = _crlf(p, pos + 1, end)
            idn = trusted_int(p, pos + 1, le)
            if idn < 0:
                raise _layout(None)
            idp = le + 2
            pos = idp + idn + 2
            self.last_id = PyBytes_FromStringAndSize(p + idp, idn) if k == n - 1 else self.last_id
            take = not self.passed
            if take and self._bounded:
                if stream_id_parts(p + idp, idn, &ms, &seq) < 0:
                    raise _data_error(f"not a stream entry id: {PyBytes_FromStringAndSize(p + idp, idn)!r}")
                if ms > self._end_ms or (ms == self._end_ms and seq > self._end_seq):
                    self.passed = True
                    take = False
            # the fields: a flat array of blob strings, or nil for a deleted entry
            if p[pos] == 95 or (p[pos] == 42 and p[pos + 1] == 45) or (p[pos] == 36 and p[pos + 1] == 45):
                pos = _crlf(p, pos + 1, end) + 2
                continue
            if p[pos] != 42:
                raise _layout(reader.value_at(&pos))
            le = _crlf(p, pos + 1, end)
            m = trusted_int(p, pos + 1, le)
            pos = le + 2
            if m % 2 == 1:
                raise _data_error("a stream entry with a field name but no value")
            if take:
                self._ids.write(p + idp, idn)
                _offset(self._id_off, self._ids.length())
            for j in range(m):
                if p[pos] != 36:
                    raise _layout(reader.value_at(&pos))
                le = _crlf(p, pos + 1, end)
                vl = trusted_int(p, pos + 1, le)
                if vl < 0:
                    raise _data_error("a stream entry with a nil field")
                if take:
                    if j % 2 == 0:
                        self._keys.write(p + le + 2, vl)
                        _offset(self._key_off, self._keys.length())
                    else:
                        self._vals.write(p + le + 2, vl)
                        _offset(self._val_off, self._vals.length())
                pos = le + 2 + vl + 2
            if take:
                self._pairs += m // 2
                self._rows += 1
                _offset(self._map_off, self._pairs)
        at[0] = pos
        return n

    def take(self):
        """``(rows, pairs, ids, id_offsets, keys, key_offsets, values, value_offsets, map_offsets)``
        as bytes (offsets: little-endian int32, ``rows + 1`` or ``pairs + 1`` of them); then empty."""
        out = (self._rows, self._pairs, self._ids.to_bytes(), self._id_off.to_bytes(), self._keys.to_bytes(),
               self._key_off.to_bytes(), self._vals.to_bytes(), self._val_off.to_bytes(), self._map_off.to_bytes())
        self._reset()
        return out


cdef object _layout(object reply):
    return _data_error(f"not a stream entries reply: {reply!r:.200}")
