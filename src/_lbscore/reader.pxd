cdef enum:
    # Deepest nesting of aggregates a reply may have (Redis's own replies
    # stay under 8; hiredis allows 9 by default).
    READER_MAX_DEPTH = 64


cdef enum ReplyShape:
    # What the caller knows a reply to be, so the reader can build Entry
    # objects straight from the bytes; any other shape is read generically.
    SHAPE_ANY = 0             # read generically
    SHAPE_ENTRIES = 1         # an array of stream entries (XRANGE, XCLAIM)
    SHAPE_SCRIPT_ENTRIES = 2  # an array whose first element is an array of entries (read-3.lua)
    SHAPE_XREAD = 3           # XREAD[GROUP]: [[stream, entries], ...] (RESP2) or {stream: entries} (RESP3)
    SHAPE_MESSAGES = 4        # XRANGE of a keyed data stream: Message objects (messages.pyx), no parser


cdef class RespReader:
    cdef:
        char *_buf
        Py_ssize_t _cap
        Py_ssize_t _start       # first byte not yet returned as a reply
        Py_ssize_t _end         # one past the last byte fed
        Py_ssize_t _scan        # how far the reply at _start has been checked
        Py_ssize_t _reply_end   # >= 0: a whole, checked reply lies in [_start, _reply_end)
        Py_ssize_t _depth       # open aggregates at _scan
        long long _stack[READER_MAX_DEPTH]  # elements still due in each open aggregate
        object _reply_error     # callable(str) -> the object an error reply becomes
        str _broken             # the protocol error that ended this reader, or None

    cdef int _feed(self, const char *data, Py_ssize_t n) except -1
    cdef int _check(self) except -1
    cdef int _fail(self, str message) except -1
    cdef int _check_double(self, const char *p, Py_ssize_t a, Py_ssize_t b) except -1
    cdef int _check_big(self, const char *p, Py_ssize_t a, Py_ssize_t b) except -1
    cdef object gets_c(self, int shape, EntryParser parser)
    cdef inline Py_ssize_t unread(self) noexcept

    # For the in-place readers (entryparse.pyx, columns.pyx): next_reply()
    # says where a whole, checked reply starts in data(); they walk its bytes
    # (up to data_end()), build any part they do not read themselves with
    # value_at(), and consume() the reply when done, even on an error.
    cdef inline Py_ssize_t next_reply(self) except -2
    cdef inline const char *data(self) noexcept
    cdef inline Py_ssize_t data_end(self) noexcept
    cdef object value_at(self, Py_ssize_t *pos)
    cdef void consume(self) noexcept
