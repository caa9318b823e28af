cdef object read_shaped(RespReader r, Py_ssize_t *pos, int shape, EntryParser parser)
