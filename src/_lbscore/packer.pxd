cdef int pack_arg(WriteBuffer buf, object value) except -1
cdef int pack_into(WriteBuffer buf, object args) except -1
