cdef Py_ssize_t _json_depth(const char* p, Py_ssize_t n)
cdef Py_ssize_t _lone_surrogate(const char* p, Py_ssize_t n) noexcept
