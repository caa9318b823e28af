cdef class CommandBatch:
    cdef:
        WriteBuffer _buf
        Py_ssize_t _count   # commands encoded so far
        list _shapes        # reply shape per command (ReplyShape), None while all are SHAPE_ANY

    cdef int _lock_key(self, bytes prefix, object entry_id) except -1
