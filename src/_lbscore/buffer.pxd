from libc.stdint cimport int64_t


cdef class WriteBuffer:
    """A growable byte buffer: the one allocation a batch of commands is encoded into."""

    cdef:
        char *_buf
        Py_ssize_t _size      # bytes allocated
        Py_ssize_t _length    # bytes written

    cdef inline int _ensure(self, Py_ssize_t extra) except -1
    cdef int write(self, const char *data, Py_ssize_t n) except -1
    cdef int write_byte(self, char c) except -1
    cdef int write_len_header(self, char kind, Py_ssize_t n) except -1
    cdef int write_bulk(self, const char *data, Py_ssize_t n) except -1
    cdef int write_bulk2(self, const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn) except -1
    cdef int write_int(self, int64_t v) except -1
    cdef bytes to_bytes(self)
    cdef bytes since(self, Py_ssize_t start)
    cdef inline Py_ssize_t length(self) noexcept
    cdef inline void clear(self) noexcept
