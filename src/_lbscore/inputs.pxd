cdef tuple decode_input_c(object raw)
