from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t
from libc.string cimport memcpy


cdef int format_int64(int64_t v, char *out) noexcept:
    # Decimal digits of v into out (at least 21 bytes); returns how many.
    cdef char tmp[24]
    cdef int i = 0, n = 0
    cdef unsigned long long u
    if v < 0:
        out[n] = c'-'
        n += 1
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    if u == 0:
        tmp[0] = c'0'
        i = 1
    while u > 0:
        tmp[i] = <char>(c'0' + u % 10)
        u //= 10
        i += 1
    while i > 0:
        i -= 1
        out[n] = tmp[i]
        n += 1
    return n


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
        self._ensure(24 + 3)
        self._buf[self._length] = kind
        self._length += 1
        self._length += format_int64(n, self._buf + self._length)
        self._buf[self._length] = c'\r'
        self._buf[self._length + 1] = c'\n'
        self._length += 2
        return 0

    cdef bytes to_bytes(self):
        return PyBytes_FromStringAndSize(self._buf, self._length)

    def __len__(self):
        return self._length
