cdef class XaddRoute:
    cdef:
        public CommandBatch batch     # the batch of the node owning the stream
        public object stream          # the stream's name
        public Py_ssize_t size        # rows per IDMP producer id; 0: no IDMP
        public bytes pid_prefix       # the producer id before the chunk number
        public Py_ssize_t count       # the stream's rows encoded so far
