# RESP2/RESP3 replies, parsed from the bytes a connection delivers.
#
# Two passes per reply. _check walks the bytes as they arrive and only keeps
# a stack of how many elements each open aggregate still owes, so a reply
# that arrives in many chunks is checked once, not once per chunk; it rejects
# anything that is not RESP. Once a whole reply is there, _value builds it
# trusting what _check proved (no bounds checks, no partial objects to undo).
#
# The generic objects are hiredis-py's (what redis-py's hiredis parser gets):
# bytes, int, None, list, dict, float, bool; error replies become whatever
# reply_error returns, as values, so one failed command of a batch does not
# hide the replies of the others. Where the caller says a reply holds stream
# entries (ReplyShape), entryparse.pyx builds them straight from the buffer;
# it and columns.pyx read a checked reply through next_reply, data, data_end,
# value_at and consume, the methods reader.pxd declares for them.
#
# Deliberate differences from hiredis-py: a RESP3 big number is an int (as
# in redis-py's Python parser), not its digits as bytes; a blob error (!) is
# an error reply, not a protocol error; an attribute (|) is skipped and the
# value it annotates returned; a double too large for a float is inf.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcmp, memmove, memcpy

cdef extern from "Python.h":
    # overflow_exception NULL: an out-of-range value becomes +-inf.
    double PyOS_string_to_double(const char *s, char **endptr, void *overflow_exception) except? -1.0


class Shape:
    """Where a reply's stream entries are, for RespReader.gets_entries and
    CommandBatch.expect (any other reply is read generically)."""

    ANY = SHAPE_ANY
    ENTRIES = SHAPE_ENTRIES
    SCRIPT_ENTRIES = SHAPE_SCRIPT_ENTRIES
    XREAD = SHAPE_XREAD
    MESSAGES = SHAPE_MESSAGES


cdef class _NeedMore:
    def __repr__(self):
        return "NEED_MORE"


#: What RespReader.gets returns while the reply is still incomplete.
NEED_MORE = _NeedMore()

cdef object _NEED_MORE = NEED_MORE

# A buffer grown past this for one big reply is freed once it is consumed.
cdef Py_ssize_t _KEEP_BUFFER = 4 << 20


cdef inline Py_ssize_t _crlf(const char *p, Py_ssize_t pos, Py_ssize_t end) noexcept:
    # Index of the first "\r\n" at or after pos, or -1.
    cdef const char *q
    while pos < end:
        q = <const char *>memchr(p + pos, 13, end - pos)
        if q == NULL:
            return -1
        pos = q - p
        if pos + 1 >= end:
            return -1
        if p[pos + 1] == 10:
            return pos
        pos += 1
    return -1


cdef class RespReader:
    """A RESP2/RESP3 reply reader: ``feed`` bytes, ``gets`` replies.

    ``gets()`` returns :data:`NEED_MORE` until a whole reply has arrived.
    Error replies are returned (not raised) as ``reply_error(message)``
    (default: :class:`ReplyError`; lbs passes redis-py's ``ResponseError``).
    Bytes that are not RESP raise ``lbs.ProtocolError``, and so does every
    later call: the connection they came from is out of step and must go.
    """

    def __cinit__(self, reply_error=None):
        self._buf = NULL
        self._cap = 0
        self._start = self._end = self._scan = 0
        self._reply_end = -1
        self._depth = 0
        self._reply_error = ReplyError if reply_error is None else reply_error
        self._broken = None

    def __dealloc__(self):
        if self._buf is not NULL:
            PyMem_Free(self._buf)
            self._buf = NULL

    def feed(self, data):
        """Append bytes received from the server (bytes, bytearray or memoryview)."""
        cdef lbs_byteview view
        if type(data) is bytes:
            self._feed(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
        else:
            # Not a typed memoryview: that needs the buffer protocol in
            # Cython's own code, which 3.10's limited API lacks (compat.h).
            lbs_byteview_get(memoryview(data).cast("B"), &view)
            try:
                self._feed(view.buf, view.len)
            finally:
                lbs_byteview_release(&view)

    def gets(self):
        """The next whole reply, or :data:`NEED_MORE`."""
        return self.gets_c(SHAPE_ANY, None)

    def gets_entries(self, EntryParser parser, int shape=SHAPE_ENTRIES):
        """The next reply with its stream entries built as Entry objects (``Shape.MESSAGES``: as
        Message objects, and ``parser`` may be None).

        ``shape`` says where the entries are (a :class:`Shape` value).
        A reply of any other shape (an error, a nil) comes back generically.
        """
        if shape < SHAPE_ANY or shape > SHAPE_MESSAGES:
            raise _data_error(f"unknown reply shape {shape}")
        if parser is None and shape != SHAPE_MESSAGES and shape != SHAPE_ANY:
            raise _data_error(f"reply shape {shape} needs an EntryParser")
        return self.gets_c(shape, parser)

    cdef int _feed(self, const char *data, Py_ssize_t n) except -1:
        cdef Py_ssize_t live, need, cap
        cdef char *grown
        if n <= 0:
            return 0
        if self._end + n > self._cap:
            if self._start > 0:
                # Slide the unread bytes to the front; the check's position
                # moves with them, so it resumes where it stopped.
                live = self._end - self._start
                memmove(self._buf, self._buf + self._start, live)
                self._scan -= self._start
                if self._reply_end >= 0:
                    self._reply_end -= self._start
                self._end = live
                self._start = 0
            if self._end + n > self._cap:
                need = self._end + n
                cap = self._cap if self._cap else 16384
                while cap < need:
                    cap *= 2
                grown = <char *>PyMem_Realloc(self._buf, cap)
                if grown == NULL:
                    raise MemoryError()
                self._buf = grown
                self._cap = cap
        memcpy(self._buf + self._end, data, n)
        self._end += n
        if LBS_DEBUG and not (0 <= self._start <= self._scan <= self._end <= self._cap):
            _internal_error(f"reader positions out of order: start {self._start} scan {self._scan} "
                            f"end {self._end} capacity {self._cap}")
        return 0

    cdef int _fail(self, str message) except -1:
        self._broken = message
        raise _protocol_error(message)

    cdef int _check(self) except -1:
        # 1 when a whole reply lies at _start (its end in _reply_end), 0 when
        # more bytes are needed; raises on anything that is not RESP.
        cdef const char *p = self._buf
        cdef Py_ssize_t pos = self._scan, end = self._end, le, nxt
        cdef long long n = 0  # (set by parse_int64 before each use; the compiler cannot tell)
        cdef char t
        if self._reply_end >= 0:
            return 1
        while pos < end:
            le = _crlf(p, pos + 1, end)
            if le < 0:
                break
            t = p[pos]
            nxt = le + 2
            if t == 36 or t == 33 or t == 61:  # $ ! =  (blob string, blob error, verbatim)
                if parse_int64(p, pos + 1, le, &n) < 0 or n < -1 or (n == -1 and t != 36):
                    self._fail(f"invalid length {p[pos + 1:le]!r} of a {chr(t)!r} reply")
                if n >= 0:
                    if n > end - nxt - 2:  # (not nxt + n + 2 > end: n may be near 2**63)
                        break
                    if p[nxt + n] != 13 or p[nxt + n + 1] != 10:
                        self._fail(f"a {chr(t)!r} reply of {n} bytes is not followed by CRLF")
                    if t == 61 and (n < 4 or p[nxt + 3] != 58):
                        self._fail("a verbatim string without its 3-letter format prefix")
                    nxt += n + 2
            elif t == 42 or t == 126 or t == 62 or t == 37 or t == 124:  # * ~ > % |
                if parse_int64(p, pos + 1, le, &n) < 0 or n < -1 or (n == -1 and t != 42) \
                        or n > 0x7fffffff:
                    self._fail(f"invalid element count {p[pos + 1:le]!r} of a {chr(t)!r} reply")
                if t == 37 and n > 0:
                    n *= 2
                elif t == 124:
                    n = 2 * n + 1  # the attribute's pairs, then the value it annotates
                if n > 0:
                    if self._depth >= READER_MAX_DEPTH:
                        self._fail(f"replies nested more than {READER_MAX_DEPTH} deep")
                    self._stack[self._depth] = n
                    self._depth += 1
                    pos = nxt
                    self._scan = pos
                    continue
            elif t == 43 or t == 45:  # + -
                pass
            elif t == 58:  # :
                if parse_int64(p, pos + 1, le, &n) < 0:
                    self._fail(f"invalid integer reply {p[pos + 1:le]!r}")
            elif t == 95:  # _
                if le != pos + 1:
                    self._fail(f"a null reply with a payload {p[pos + 1:le]!r}")
            elif t == 35:  # #
                if le != pos + 2 or (p[pos + 1] != 116 and p[pos + 1] != 102):
                    self._fail(f"invalid boolean reply {p[pos + 1:le]!r}")
            elif t == 44:  # ,
                self._check_double(p, pos + 1, le)
            elif t == 40:  # (
                self._check_big(p, pos + 1, le)
            else:
                self._fail(f"unknown reply type byte {p[pos:pos + 1]!r}")
            pos = nxt
            # One element is complete: close every aggregate it completes.
            while self._depth > 0:
                self._stack[self._depth - 1] -= 1
                if self._stack[self._depth - 1] > 0:
                    break
                self._depth -= 1
            self._scan = pos
            if self._depth == 0:
                self._reply_end = pos
                if LBS_DEBUG and pos > end:
                    _internal_error(f"a reply checked to {pos}, past the {end} bytes fed")
                return 1
        self._scan = pos
        return 0

    cdef inline Py_ssize_t next_reply(self) except -2:
        # Where the next whole, checked reply starts in data(), or -1 while
        # more bytes are needed; raises once the stream is broken.
        if self._broken is not None:
            raise _protocol_error(self._broken)
        if self._check() == 0:
            return -1
        return self._start

    cdef inline Py_ssize_t unread(self) noexcept:
        # Bytes fed but not yet returned as replies.
        return self._end - self._start

    cdef inline const char *data(self) noexcept:
        return self._buf

    cdef inline Py_ssize_t data_end(self) noexcept:
        # One past the last byte fed.
        return self._end

    cdef int _check_double(self, const char *p, Py_ssize_t a, Py_ssize_t b) except -1:
        cdef bytes text = PyBytes_FromStringAndSize(p + a, b - a)
        cdef char *endp = NULL
        if b > a and (p[a] == 45 or p[a] == 43 or is_digit(p[a]) or p[a] == 46 or (b - a == 3 and (
                memcmp(p + a, b"inf", 3) == 0 or memcmp(p + a, b"nan", 3) == 0))):
            try:
                PyOS_string_to_double(PyBytes_AS_STRING(text), &endp, NULL)
            except ValueError:  # no number at the start at all
                endp = NULL
            if endp == PyBytes_AS_STRING(text) + (b - a):
                return 0
        self._fail(f"invalid double reply {text!r}")

    cdef int _check_big(self, const char *p, Py_ssize_t a, Py_ssize_t b) except -1:
        # -?[0-9]+, of any length.
        if digits_end(p, b, a + 1 if a < b and p[a] == 45 else a) != b:
            self._fail(f"invalid big number reply {p[a:b]!r}")
        return 0

    cdef object gets_c(self, int shape, EntryParser parser):
        cdef Py_ssize_t pos = self.next_reply()
        if pos < 0:
            return _NEED_MORE
        try:
            if shape == SHAPE_ANY or (parser is None and shape != SHAPE_MESSAGES):
                reply = self.value_at(&pos)
            else:
                reply = read_shaped(self, &pos, shape, parser)
            if LBS_DEBUG and pos != self._reply_end:
                _internal_error(f"reply built to {pos}, checked to {self._reply_end}")
        finally:
            # The reply is consumed even if building it failed: the next one
            # starts where the check said this one ends.
            self.consume()
        return reply

    cdef void consume(self) noexcept:
        # Drop the checked reply at _start.
        self._start = self._scan = self._reply_end
        self._reply_end = -1
        if self._start == self._end:
            self._start = self._end = self._scan = 0
            if self._cap > _KEEP_BUFFER:
                # A huge reply is gone: do not keep its memory.
                PyMem_Free(self._buf)
                self._buf = NULL
                self._cap = 0

    cdef object value_at(self, Py_ssize_t *pos):
        # The reply (or element) at pos[0], built generically; pos[0] moves past it.
        cdef const char *p = self._buf
        cdef Py_ssize_t i = pos[0], le, nxt
        cdef long long n, k
        cdef char t = p[i]
        cdef list items
        cdef dict d
        le = _crlf(p, i + 1, self._end)
        nxt = le + 2
        if t == 36:  # $
            n = trusted_int(p, i + 1, le)
            if n < 0:
                pos[0] = nxt
                return None
            pos[0] = nxt + n + 2
            return PyBytes_FromStringAndSize(p + nxt, n)
        if t == 42 or t == 126 or t == 62:  # * ~ >
            n = trusted_int(p, i + 1, le)
            pos[0] = nxt
            if n < 0:
                return None
            items = []
            for k in range(n):
                items.append(self.value_at(pos))
            return items
        if t == 37:  # %
            n = trusted_int(p, i + 1, le)
            pos[0] = nxt
            if n < 0:
                return None
            d = {}
            for k in range(n):
                key = self.value_at(pos)
                value = self.value_at(pos)
                try:
                    d[key] = value
                except TypeError:
                    raise _protocol_error(f"a map key of type {type(key).__name__}")
            return d
        if t == 124:  # |: skip the attribute, return what it annotates
            n = trusted_int(p, i + 1, le)
            pos[0] = nxt
            for k in range(2 * n):
                self.value_at(pos)
            return self.value_at(pos)
        pos[0] = nxt
        if t == 43:  # +
            return PyBytes_FromStringAndSize(p + i + 1, le - i - 1)
        if t == 58:  # :
            return trusted_int(p, i + 1, le)
        if t == 45:  # -
            return self._reply_error(PyUnicode_DecodeUTF8(p + i + 1, le - i - 1, "replace"))
        if t == 33 or t == 61:  # ! =
            n = trusted_int(p, i + 1, le)
            pos[0] = nxt + n + 2
            if t == 61:
                return PyBytes_FromStringAndSize(p + nxt + 4, n - 4)
            return self._reply_error(PyUnicode_DecodeUTF8(p + nxt, n, "replace"))
        if t == 95:  # _
            return None
        if t == 35:  # #
            return p[i + 1] == 116
        if t == 44:  # ,
            return PyOS_string_to_double(PyBytes_AS_STRING(PyBytes_FromStringAndSize(p + i + 1, le - i - 1)),
                                         NULL, NULL)
        if t == 40:  # (
            return int(PyBytes_FromStringAndSize(p + i + 1, le - i - 1))
        _internal_error(f"unchecked reply type {t!r}")
