cdef tuple decode_input_c(object raw)
cdef tuple decode_input_ptr(const char* p, Py_ssize_t n)
