from libc.stdint cimport int64_t


cdef class _HeldKeys:
    # What every Held of one client shares: its lock values are
    # "<token>:<lock owner>" and its lock keys "<lock prefix><entry id>".
    # The lock owner is the consumer id and the process's instance nonce,
    # "<consumer id>:<instance>" (field name kept: consumer_id).
    cdef:
        readonly str consumer_id
        readonly str lock_prefix
        bytes value_suffix  # b":" + consumer id, UTF-8: a lock value after its token
        bytes key_prefix    # the lock prefix, UTF-8


cdef class Held:
    cdef:
        readonly str entry_id
        readonly str stream
        object _info               # the entry's Info dict; None stands for an empty one until read
        readonly int64_t retry_count
        readonly int64_t token
        public object task         # the run() handler's task, if any
        readonly double taken_at   # when it was taken (the client's monotonic clock, seconds)
        # Whether recovery sees it as running: MARK_HELD (in the consumer's queued set: waiting for
        # the application), MARK_WANTED (taken, Redis not told yet), MARK_SENT (told, no answer yet),
        # MARK_RUNNING (not in the set: running).
        unsigned char mark
        _HeldKeys _keys
        object _entry              # the Entry, kept only when it has fields beyond lbs's own (.fields)

    # A record made without __init__ (_new_held): what it shares, its Info (None: empty).
    cdef inline void set_keys(self, _HeldKeys keys) noexcept
    cdef inline void set_info(self, object info) noexcept
    # The UTF-8 parts the encoders write around the token and the entry id
    # (pipeline.pyx's evalsha_over_locks).
    cdef inline bytes lock_value_suffix(self)
    cdef inline bytes lock_key_prefix(self)


cdef class HeldTable:
    cdef:
        dict _by_id        # entry id -> Held
        dict _by_stream    # stream -> Held, or a list of Held (oldest first) when several share a name
        _HeldKeys _keys

    cdef int _add(self, Held h) except -1
    cdef int _index(self, Held h) except -1
    cdef int _unindex(self, Held h) except -1
