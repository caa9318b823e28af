# The messages of a keyed data stream (lbs.keyed), as a keyed handler gets
# them: reader.pyx builds them straight from an XRANGE reply
# (SHAPE_MESSAGES), keeping each message's fields as the RESP bytes of their
# array; .fields decodes those (UTF-8, invalid bytes replaced) on first
# access, so a handler pays only for the messages whose fields it reads.

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8


@cython.freelist(512)
cdef class Message:
    """One message of a key's data stream: its ``id`` (ids only grow: the order of the key) and
    its ``fields``, decoded as UTF-8 (invalid bytes replaced) when first read."""

    def __init__(self, str id not None, fields=None):
        self.id = id
        self._fields = None if fields is None else dict(fields)
        self._resp = None

    cdef inline void set_fields(self, dict fields, bytes resp) noexcept:
        self._fields = fields
        self._resp = resp

    @property
    def fields(self):
        """The message's fields, ``{name: value}`` as str (built on first access)."""
        if self._fields is None:
            self._fields = {} if self._resp is None else _text_pairs(self._resp)
            self._resp = None
        return self._fields

    def __repr__(self):
        return f"Message(id={self.id!r}, fields={self.fields!r})"

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        return self.id == (<Message>other).id and self.fields == (<Message>other).fields

    __hash__ = None


cdef inline Message _message(str message_id, bytes resp):
    cdef Message m = Message.__new__(Message)
    m.id = message_id
    m.set_fields(None, resp)
    return m


cdef Message _message_of(object item):
    # A message from a reply built generically (an entry of a shape the
    # reader did not read in place): [id, [field, value, ...]].
    cdef Message m = Message.__new__(Message)
    cdef dict fields = {}
    if not isinstance(item, (list, tuple)) or len(item) < 2 or not isinstance(item[0], (bytes, str)) \
            or not (item[1] is None or isinstance(item[1], (list, tuple, dict))):
        raise _protocol_error(f"not a stream message: {item!r:.200}")
    m.id = _text(item[0])
    raw = item[1]
    if isinstance(raw, dict):
        for k, v in (<dict>raw).items():
            fields[_text(k)] = _text(v)
    elif raw is not None:
        it = iter(raw)
        for k in it:
            fields[_text(k)] = _text(next(it, b""))
    m.set_fields(fields, None)
    return m


cdef dict _text_pairs(bytes resp):
    # "*<m>\r\n" then m blob strings ("$<n>\r\n<bytes>\r\n"), checked by the
    # reader when it arrived: {field: value}, later fields winning.
    cdef const char *p = PyBytes_AS_STRING(resp)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(resp), i, le, n
    cdef long long m, k
    cdef dict out = {}
    cdef str name = None
    le = _crlf(p, 1, end)
    m = trusted_int(p, 1, le)
    i = le + 2
    for k in range(m):
        le = _crlf(p, i + 1, end)
        n = trusted_int(p, i + 1, le)
        value = PyUnicode_DecodeUTF8(p + le + 2, n, "replace")
        i = le + 2 + n + 2
        if k % 2 == 0:
            name = value
        else:
            out[name] = value
    if m % 2 == 1:
        out[name] = ""
    return out


def messages_of(object reply):
    """Messages from an XRANGE reply built generically (a script's reply): ``[[id, [field, value,
    ...]], ...]``; :class:`lbs.ProtocolError` for anything else."""
    if not isinstance(reply, (list, tuple)):
        raise _protocol_error(f"not a list of stream messages: {reply!r:.200}")
    return [_message_of(item) for item in reply]
