cdef class CommandBatch:
    cdef:
        WriteBuffer _buf
        Py_ssize_t _count   # commands encoded so far
        list _shapes        # reply shape per command (ReplyShape), None while all are SHAPE_ANY

    # The core's other encoders (held.pyx, xadds.pyx) write a command into
    # buffer(), then count it with command_written().
    cdef inline WriteBuffer buffer(self)
    cdef inline void command_written(self) noexcept


cdef int evalsha_over_locks(WriteBuffer buf, object sha, tuple head_keys, bytes prefix, list locks,
                            Py_ssize_t start, Py_ssize_t stop, Py_ssize_t nargs) except -1
cdef int _check_command(WriteBuffer buf, Py_ssize_t start) except -1
