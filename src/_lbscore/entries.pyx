# LBS entries as the client reads them: XREADGROUP / XRANGE replies become
# typed Entry objects, either straight from the RESP bytes (reader.pyx) or
# from (id, fields) pairs another parser built (redis-py's RESP2 or RESP3).
# A malformed entry becomes an Entry carrying the reason (for the dead-letter
# path), never an exception that would abort the batch.

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcmp


cdef inline str _text(object v):
    if isinstance(v, bytes):
        return (<bytes>v).decode("utf-8", "replace")
    if isinstance(v, str):
        return <str>v
    return str(v)


cdef inline bint all_bytes(list items):
    for item in items:
        if type(item) is not bytes:
            return False
    return True


cdef bytes _str_bytes(str x):
    # A str another parser made, as the bytes it came from: never raises, so
    # one odd field fails no batch. Bytes decoded with surrogateescape come
    # back as they were; any other lone surrogate becomes bytes that are not
    # UTF-8 (the entry is judged malformed).
    try:
        return x.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return x.encode("utf-8", "surrogatepass")


cdef inline object _as_bytes(object value):
    if value is None or type(value) is bytes:
        return value
    return _str_bytes(<str>value) if isinstance(value, str) else bytes(value)


cdef inline Span _span(object value):
    # A span over a bytes object the caller keeps alive, or an absent field.
    cdef Span s
    if value is None:
        s.p = NULL
        s.n = -1
    else:
        s.p = PyBytes_AS_STRING(value)
        s.n = PyBytes_GET_SIZE(value)
    return s


cdef inline str _span_text(Span s):
    return PyUnicode_DecodeUTF8(s.p, s.n, "replace")


cdef inline bytes _field_bytes(object x):
    if type(x) is bytes:
        return <bytes>x
    if isinstance(x, str):
        return _str_bytes(<str>x)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if x is None:
        return b""
    if isinstance(x, (int, float)):
        return str(x).encode()
    return repr(x).encode()  # not a field a stream can hold; shown, never fatal


cdef dict _fields_dict(object raw, bint resp):
    # The entry's fields as {bytes: bytes}, from whatever form the reply had
    # (``resp``: the RESP bytes of the field array, kept by the reader).
    cdef dict fields = {}
    if raw is None:
        return fields
    if resp:
        r = RespReader()
        r.feed(raw)
        raw = r.gets()
    if isinstance(raw, dict):
        for k, v in (<dict>raw).items():
            fields[_field_bytes(k)] = _field_bytes(v)
        return fields
    if not isinstance(raw, (list, tuple)):
        return fields
    it = iter(raw)
    for k in it:
        fields[_field_bytes(k)] = _field_bytes(next(it, b""))
    return fields


cdef Entry _unreadable(object item):
    cdef Entry e = Entry.__new__(Entry)
    e.id = ""
    e.retry_count = 0
    e.idle_ms = -1
    e.delivery_count = 0
    e.stream = e.info = e.original_id = None
    e.set_raw_fields(None, False)
    e.error = f"not a stream entry: {item!r:.200}"
    return e


@cython.freelist(256)
cdef class Entry:

    def __repr__(self):
        if self.error is not None:
            return f"<Entry {self.id} malformed: {self.error}>"
        return f"<Entry {self.id} stream={self.stream!r} retry_count={self.retry_count}>"

    cdef inline void set_raw_fields(self, object raw_fields, bint resp_fields) noexcept:
        self._raw_fields = raw_fields
        self._resp_fields = resp_fields
        self._fields = None

    @property
    def fields(self):
        """The entry's fields as a dict of bytes (built on first access)."""
        if self._fields is None:
            self._fields = _fields_dict(self._raw_fields, self._resp_fields)
        return self._fields

    @property
    def ok(self):
        """True when the entry is a well-formed assignment."""
        return self.error is None

    @property
    def claimed(self):
        """True when XREADGROUP CLAIM handed this entry over from an idle holder."""
        return self.delivery_count > 0


cdef class EntryParser:
    """Turns (id, fields) pairs into Entry objects.

    ``input_field`` holds the JSON assignment; ``retry_field`` and
    ``original_field`` are the library-managed fields (``_retry_count``,
    ``_original_id`` with the default prefix). ``max_input_bytes`` bounds the
    JSON value; a bigger one is malformed.
    """

    def __init__(self, str input_field="lbs-input", str retry_field="_retry_count",
                 str original_field="_original_id", Py_ssize_t max_input_bytes=65536):
        self._input_field = input_field.encode()
        self._retry_field = retry_field.encode()
        self._original_field = original_field.encode()
        self._max_input_bytes = max_input_bytes

    cdef inline FieldRole field_role(self, const char *name, Py_ssize_t n) noexcept:
        # A field name read in place (entryparse.pyx): one of ours, or another.
        if n == PyBytes_GET_SIZE(self._input_field) and memcmp(name, PyBytes_AS_STRING(self._input_field), n) == 0:
            return FIELD_INPUT
        if n == PyBytes_GET_SIZE(self._retry_field) and memcmp(name, PyBytes_AS_STRING(self._retry_field), n) == 0:
            return FIELD_RETRY
        if n == PyBytes_GET_SIZE(self._original_field) \
                and memcmp(name, PyBytes_AS_STRING(self._original_field), n) == 0:
            return FIELD_ORIGINAL
        return FIELD_OTHER

    cdef Entry parse_one(self, object raw_id, object raw_fields, object extra):
        # From values another parser built (hiredis/redis-py's, or ours on
        # the generic path): bytes, or str under decode_responses.
        cdef dict fields
        cdef object raw, rc, oid
        cdef bint other = True  # unless the flat walk below sees every field
        raw = rc = oid = None
        if raw_fields is not None and type(raw_fields) is list and all_bytes(<list>raw_fields):
            # The flat [k1, v1, k2, v2, ...] of RESP2 and of scripts: pick the
            # three fields we read without building a dict (later keys win,
            # as in a dict).
            flat = <list>raw_fields
            other = False
            for i in range(0, len(flat) - 1, 2):
                k = flat[i]
                if k == self._input_field:
                    raw = flat[i + 1]
                elif k == self._retry_field:
                    rc = flat[i + 1]
                elif k == self._original_field:
                    oid = flat[i + 1]
                else:
                    other = True
        elif raw_fields is not None:
            if not isinstance(raw_fields, (list, tuple, dict)):
                e = self.parse_parts(_text(raw_id), [], _span(None), _span(None), _span(None), extra)
                e.error = f"the entry's fields are not a list: {raw_fields!r:.100}"
                return e
            fields = _fields_dict(raw_fields, False)
            raw = fields.get(self._input_field)
            rc = fields.get(self._retry_field)
            oid = fields.get(self._original_field)
        raw, rc, oid = _as_bytes(raw), _as_bytes(rc), _as_bytes(oid)
        return self.parse_parts(_text(raw_id), raw_fields, _span(raw), _span(rc), _span(oid), extra,
                                False, other)

    cdef Entry parse_parts(self, str entry_id, object raw_fields, Span raw, Span rc, Span oid,
                           object extra, bint resp_fields=False, bint other=True):
        # The one place an entry is judged: both the generic path (parse_one)
        # and the RESP reader's direct path (which never makes bytes objects
        # for the fields) end here. A span with n < 0 is an absent field.
        cdef Entry e = Entry.__new__(Entry)
        cdef long long v
        cdef tuple decoded
        e.id = entry_id
        e.retry_count = 0
        e.idle_ms = -1
        e.delivery_count = 0
        e.stream = None
        e.info = None
        e.original_id = None
        e.error = None
        # ``other``: a field beyond the three read here (a producer plugin's trace context, say), or
        # one may be (the generic paths do not look): HeldTable.take keeps such an entry for Held.fields.
        e._other = other
        e.set_raw_fields(raw_fields, resp_fields and raw_fields is not None)
        if extra is not None:
            # XREADGROUP CLAIM: [id, fields, idle, delivery count]. Server 8.4.0
            # sent the two numbers as strings, later versions as integers.
            try:
                e.idle_ms = int(extra[0])
                e.delivery_count = int(extra[1])
            except (TypeError, ValueError, IndexError, OverflowError):
                e.idle_ms, e.delivery_count = -1, 0
                e.error = f"unreadable CLAIM metadata {extra!r:.200}"
        if raw_fields is None:
            # A pending reference to an entry deleted or trimmed from the stream.
            e.error = "entry was deleted from the stream"
            return e
        if rc.n >= 0:
            if parse_int64(rc.p, 0, rc.n, &v) < 0 or v < 0:
                # Not plain digits: int() decides, as it did before the fast path.
                text = _span_text(rc)
                try:
                    v = int(PyBytes_FromStringAndSize(rc.p, rc.n))
                    if v < 0:
                        raise ValueError
                except (ValueError, OverflowError):
                    v = -1
                if v < 0 and e.error is None:
                    e.error = f"{self._retry_field.decode()} is not a non-negative integer: {text!r}"
            if v >= 0:
                e.retry_count = v
        if oid.n >= 0:
            e.original_id = _span_text(oid)
        if e.error is not None:
            return e
        if raw.n < 0:
            e.error = f"entry has no {self._input_field.decode()} field (fields: {sorted(_text(k) for k in e.fields)})"
            return e
        if raw.n > self._max_input_bytes:
            e.error = f"{self._input_field.decode()} is {raw.n} bytes, more than the limit of {self._max_input_bytes}"
            return e
        decoded = decode_input_ptr(raw.p, raw.n)
        if decoded[2] is not None:
            e.error = decoded[2]
        else:
            e.stream = decoded[0]
            e.info = decoded[1]
        return e

    cdef Entry parse_item(self, object item):
        # One element of an entries array, as a generic parser built it.
        if type(item) is list and len(<list>item) >= 2:
            if len(<list>item) >= 4:
                return self.parse_one(item[0], item[1], (item[2], item[3]))
            return self.parse_one(item[0], item[1], None)
        return _unreadable(item)

    def parse_entries(self, entries):
        """Parse a list of ``(id, fields)`` (or CLAIM's ``[id, fields, idle, count]``)."""
        cdef list out = []
        for item in entries:
            if type(item) is not list:
                item = list(item) if isinstance(item, tuple) else item
            out.append(self.parse_item(item))
        return out

    def parse_xreadgroup(self, reply):
        """Parse an XREADGROUP reply for one stream, in redis-py's RESP2 shape
        (``[[stream, entries]]``) or RESP3 shape (``{stream: [entries]}``)."""
        cdef list out = []
        if not reply:
            return out
        if isinstance(reply, dict):
            for wrapped in (<dict>reply).values():
                # redis-py wraps a stream's entries in one more list under RESP3.
                if wrapped and isinstance(wrapped, list) and wrapped and isinstance(wrapped[0], list) \
                        and (not wrapped[0] or not isinstance(wrapped[0][0], (bytes, str))):
                    for entries in wrapped:
                        out.extend(self.parse_entries(entries))
                else:
                    out.extend(self.parse_entries(wrapped))
        else:
            for pair in reply:
                out.extend(self.parse_entries(pair[1]))
        return out
