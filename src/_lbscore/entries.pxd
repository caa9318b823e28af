cdef class Entry:
    cdef:
        readonly str id            # entry id in the LBS, "<ms>-<seq>"
        readonly object stream     # data stream name (str), None when malformed
        readonly object info       # dict, None when malformed
        readonly long long retry_count
        readonly object original_id  # str or None: the id of the first delivery
        readonly object error      # str reason when malformed, else None
        object _raw_fields         # the reply's fields: a flat list, a dict, or (_resp_fields) RESP bytes
        bint _resp_fields          # _raw_fields is the RESP of the field array (read in place)
        dict _fields               # built from _raw_fields on first access of .fields
        bint _other                # it has fields beyond the three an EntryParser reads (or may have)
        readonly long long idle_ms         # XREADGROUP CLAIM: ms since last delivery (-1: not claimed)
        readonly long long delivery_count  # XREADGROUP CLAIM: deliveries so far (0: new entry)

    # What .fields is built from (EntryParser.parse_parts, _unreadable).
    cdef inline void set_raw_fields(self, object raw_fields, bint resp_fields) noexcept


cdef struct Span:
    # A field's value inside a buffer someone else keeps alive; n < 0: absent.
    const char *p
    Py_ssize_t n


cdef enum FieldRole:
    # Which of the fields an EntryParser reads a field name is (field_role).
    FIELD_OTHER = 0
    FIELD_INPUT = 1       # the JSON assignment (lbs-input)
    FIELD_RETRY = 2       # the retry count (_retry_count)
    FIELD_ORIGINAL = 3    # the first delivery's id (_original_id)


cdef class EntryParser:
    cdef:
        bytes _input_field
        bytes _retry_field
        bytes _original_field
        Py_ssize_t _max_input_bytes

    cdef inline FieldRole field_role(self, const char *name, Py_ssize_t n) noexcept

    cdef Entry parse_one(self, object raw_id, object raw_fields, object extra)
    cdef Entry parse_parts(self, str entry_id, object raw_fields, Span raw, Span rc, Span oid,
                           object extra, bint resp_fields=*, bint other=*)
    cdef Entry parse_item(self, object item)
