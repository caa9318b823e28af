cdef object _lbs_exception(str name)
cdef object _data_error(str message)
cdef object _invalid_input(str message)
cdef int _internal_error(str message) except -1
