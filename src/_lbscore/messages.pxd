cdef class Message:
    cdef:
        readonly str id     # the message's id in its key's data stream
        object _fields      # dict of str, built on first access of .fields (None until then)
        bytes _resp         # the RESP of the reply's field array, until decoded (None: none kept)

    # Its fields as a dict (fields), or as the RESP to decode on first access (resp).
    cdef inline void set_fields(self, dict fields, bytes resp) noexcept
