from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t
from libc.string cimport memcpy


cdef class WriteBuffer:

    def __cinit__(self, Py_ssize_t initial=1024):
        if initial < 64:
            initial = 64
        self._buf = <char *>PyMem_Malloc(initial)
        if self._buf is NULL:
            raise MemoryError()
        self._size = initial
        self._length = 0

    def __dealloc__(self):
        if self._buf is not NULL:
            PyMem_Free(self._buf)
            self._buf = NULL

    cdef inline int _ensure(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t new_size
        cdef char *new_buf
        if self._length + extra <= self._size:
            return 0
        new_size = self._size * 2
        while new_size < self._length + extra:
            new_size *= 2
        new_buf = <char *>PyMem_Realloc(self._buf, new_size)
        if new_buf is NULL:
            raise MemoryError()
        self._buf = new_buf
        self._size = new_size
        return 0

    cdef int write(self, const char *data, Py_ssize_t n) except -1:
        self._ensure(n)
        memcpy(self._buf + self._length, data, n)
        self._length += n
        if LBS_DEBUG:
            if self._length > self._size:
                _internal_error("WriteBuffer overrun")
        return 0

    cdef int write_byte(self, char c) except -1:
        self._ensure(1)
        self._buf[self._length] = c
        self._length += 1
        return 0

    cdef int write_len_header(self, char kind, Py_ssize_t n) except -1:
        # "<kind><decimal n>\r\n": the RESP array ('*') and bulk string ('$')
        # length prefix, written without building a Python str.
        if n < 0:
            _internal_error("negative RESP length")
        self._ensure(INT64_DIGITS + 3)
        self._buf[self._length] = kind
        self._length += 1
        self._length += format_int64(n, self._buf + self._length)
        self._buf[self._length] = c'\r'
        self._buf[self._length + 1] = c'\n'
        self._length += 2
        return 0

    cdef int write_bulk(self, const char *data, Py_ssize_t n) except -1:
        # One RESP bulk string: "$<n>\r\n<data>\r\n".
        return self.write_bulk2(data, n, NULL, 0)

    cdef int write_bulk2(self, const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn) except -1:
        # One RESP bulk string of two parts, a then b (a lock key is its
        # prefix and entry id, a lock value its token and owner), with a
        # single check for room.
        cdef Py_ssize_t n = an + bn, k
        cdef char *out
        self._ensure(n + INT64_DIGITS + 5)
        out = self._buf + self._length
        out[0] = c'$'
        k = 1 + format_int64(n, out + 1)
        out[k] = c'\r'
        out[k + 1] = c'\n'
        memcpy(out + k + 2, a, an)
        if bn:
            memcpy(out + k + 2 + an, b, bn)
        k += 2 + n
        out[k] = c'\r'
        out[k + 1] = c'\n'
        self._length += k + 2
        if LBS_DEBUG:
            if self._length > self._size:
                _internal_error("WriteBuffer overrun")
        return 0

    cdef int write_int(self, int64_t v) except -1:
        # v as a bulk string of its decimal digits (what repr() gives).
        cdef char digits[INT64_DIGITS]
        return self.write_bulk2(digits, format_int64(v, digits), NULL, 0)

    cdef bytes to_bytes(self):
        return PyBytes_FromStringAndSize(self._buf, self._length)

    cdef bytes since(self, Py_ssize_t start):
        # What was written from ``start`` on (a debug check reads back one command).
        return PyBytes_FromStringAndSize(self._buf + start, self._length - start)

    cdef inline Py_ssize_t length(self) noexcept:
        # Bytes written: where the next write goes.
        return self._length

    cdef inline void clear(self) noexcept:
        # Forget what was written; the memory is kept for reuse.
        self._length = 0
