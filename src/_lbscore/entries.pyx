# LBS entries as the client reads them: XREADGROUP / XRANGE replies, already
# split into (id, fields) by redis-py's RESP2 or RESP3 parser, become typed
# Entry objects. A malformed entry becomes an Entry carrying the reason (for
# the dead-letter path), never an exception that would abort the batch.


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


cdef class Entry:

    def __repr__(self):
        if self.error is not None:
            return f"<Entry {self.id} malformed: {self.error}>"
        return f"<Entry {self.id} stream={self.stream!r} retry_count={self.retry_count}>"

    @property
    def fields(self):
        """The entry's fields as a dict of bytes (built on first access)."""
        cdef dict fields
        if self._fields is None:
            raw = self._raw_fields
            if raw is None:
                fields = {}
            elif isinstance(raw, dict):
                fields = {(k.encode() if isinstance(k, str) else k): (v.encode() if isinstance(v, str) else v)
                          for k, v in (<dict>raw).items()}
            else:
                it = iter(raw)
                fields = {}
                for k in it:
                    v = next(it, b"")
                    fields[k.encode() if isinstance(k, str) else k] = v.encode() if isinstance(v, str) else v
            self._fields = fields
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

    cdef Entry parse_one(self, object raw_id, object raw_fields, object extra):
        cdef Entry e = Entry.__new__(Entry)
        cdef dict fields
        cdef object raw, rc
        cdef tuple decoded
        e.id = _text(raw_id)
        e.retry_count = 0
        e.idle_ms = -1
        e.delivery_count = 0
        e.stream = None
        e.info = None
        e.original_id = None
        e.error = None
        if extra is not None:
            # XREADGROUP CLAIM: [id, fields, idle, delivery count]. Server 8.4.0
            # sent the two numbers as strings, later versions as integers.
            try:
                e.idle_ms = int(extra[0])
                e.delivery_count = int(extra[1])
            except (TypeError, ValueError, IndexError):
                e.error = f"unreadable CLAIM metadata {extra!r}"
        e._raw_fields = raw_fields
        e._fields = None
        if raw_fields is None:
            # A pending reference to an entry deleted or trimmed from the stream.
            e.error = "entry was deleted from the stream"
            return e
        raw = rc = oid = None
        if type(raw_fields) is list and all_bytes(<list>raw_fields):
            # The flat [k1, v1, k2, v2, ...] of RESP2 and of scripts: pick the
            # three fields we read without building a dict (later keys win,
            # as in a dict).
            flat = <list>raw_fields
            for i in range(0, len(flat) - 1, 2):
                k = flat[i]
                if k == self._input_field:
                    raw = flat[i + 1]
                elif k == self._retry_field:
                    rc = flat[i + 1]
                elif k == self._original_field:
                    oid = flat[i + 1]
        else:
            fields = e.fields
            raw = fields.get(self._input_field)
            rc = fields.get(self._retry_field)
            oid = fields.get(self._original_field)
        if rc is not None:
            try:
                e.retry_count = int(rc)
                if e.retry_count < 0:
                    raise ValueError
            except ValueError:
                if e.error is None:
                    e.error = f"{self._retry_field.decode()} is not a non-negative integer: {_text(rc)!r}"
        if oid is not None:
            e.original_id = _text(oid)
        if e.error is not None:
            return e
        if raw is None:
            e.error = f"entry has no {self._input_field.decode()} field (fields: {sorted(_text(k) for k in e.fields)})"
            return e
        if len(raw) > self._max_input_bytes:
            e.error = f"{self._input_field.decode()} is {len(raw)} bytes, more than the limit of {self._max_input_bytes}"
            return e
        decoded = decode_input_c(raw)
        if decoded[2] is not None:
            e.error = decoded[2]
        else:
            e.stream = decoded[0]
            e.info = decoded[1]
        return e

    def parse_entries(self, entries):
        """Parse a list of ``(id, fields)`` (or CLAIM's ``[id, fields, idle, count]``)."""
        cdef list out = []
        for item in entries:
            if len(item) >= 4:
                out.append(self.parse_one(item[0], item[1], (item[2], item[3])))
            else:
                out.append(self.parse_one(item[0], item[1], None))
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
