cdef class EntryColumns:
    cdef:
        # Arrow's layout: ids and field values as string columns (data,
        # int32 offsets), the fields of each entry as a map (int32 offsets).
        WriteBuffer _ids, _id_off, _keys, _key_off, _vals, _val_off, _map_off
        Py_ssize_t _rows, _pairs          # entries and field pairs taken so far
        bint _bounded                     # bound() set an end id: _end_ms-_end_seq
        unsigned long long _end_ms, _end_seq
        public bint passed                # an entry after the bound was met
        public bytes last_id              # the id of the last entry read

    cdef int _reset(self) except -1
    cdef Py_ssize_t _entries(self, RespReader reader, Py_ssize_t *at) except -1
