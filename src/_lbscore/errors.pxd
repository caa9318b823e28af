cdef object _data_error(str message)
cdef object _invalid_input(str message)
cdef object _protocol_error(str message)
cdef int _internal_error(str message) except -1
