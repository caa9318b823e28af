# Replies that hold stream entries or keyed messages, read in place.
#
# The reader (reader.pyx) has checked the whole reply; where the caller said
# what it holds (ReplyShape), these walk its bytes straight into Entry
# objects (entries.pyx: no bytes object per field, no dict, the lbs-input
# JSON decoded in place) or Message objects (messages.pyx: fields kept as
# RESP until asked). They read the buffer through the reader's declared
# methods (data, data_end) and hand any part of another layout to its
# generic builder (value_at), which gives the same answer, only slower.

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8


cdef object read_shaped(RespReader r, Py_ssize_t *pos, int shape, EntryParser parser):
    cdef const char *p = r.data()
    cdef Py_ssize_t i = pos[0], le
    cdef long long n, k
    cdef char t = p[i]
    cdef list out
    if shape == SHAPE_MESSAGES:
        return _read_messages(r, pos) if t == 42 else r.value_at(pos)
    if t != 42 and not (t == 37 and shape == SHAPE_XREAD):
        if t == 95 and shape == SHAPE_XREAD:  # RESP3 null: nothing to read
            pos[0] = i + 3
            return []
        return r.value_at(pos)
    if shape == SHAPE_ENTRIES:
        return _read_entries(r, pos, parser)
    le = _crlf(p, i + 1, r.data_end())
    n = trusted_int(p, i + 1, le)
    if n < 0:
        pos[0] = le + 2
        return [] if shape == SHAPE_XREAD else None
    if shape == SHAPE_SCRIPT_ENTRIES:
        if n == 0:
            return r.value_at(pos)
        pos[0] = le + 2
        out = []
        out.append(_read_entries(r, pos, parser) if p[pos[0]] == 42 else r.value_at(pos))
        for k in range(1, n):
            out.append(r.value_at(pos))
        return out
    # SHAPE_XREAD: the entries of every stream, in reply order.
    pos[0] = le + 2
    out = []
    for k in range(n):
        if t == 37:
            r.value_at(pos)  # the stream name
            item = _read_entries(r, pos, parser) if p[pos[0]] == 42 else r.value_at(pos)
            out.extend(item if type(item) is list else ())
        elif p[pos[0]] == 42 and p[pos[0] + 1] == 50 and p[pos[0] + 2] == 13:  # *2\r
            pos[0] += 4
            r.value_at(pos)
            item = _read_entries(r, pos, parser) if p[pos[0]] == 42 else r.value_at(pos)
            out.extend(item if type(item) is list else ())
        else:
            item = r.value_at(pos)
            try:
                out.extend(parser.parse_xreadgroup([item]))
            except (TypeError, IndexError, KeyError, AttributeError):
                out.append(_unreadable(item))
    return out


cdef list _read_entries(RespReader r, Py_ssize_t *pos, EntryParser parser):
    # p[pos] is '*': an array of entries.
    cdef const char *p = r.data()
    cdef Py_ssize_t i = pos[0], le = _crlf(p, i + 1, r.data_end())
    cdef long long n = trusted_int(p, i + 1, le), k
    cdef list out = []
    pos[0] = le + 2
    for k in range(n):
        out.append(_read_entry(r, pos, parser))
    return out


cdef list _read_messages(RespReader r, Py_ssize_t *pos):
    # p[pos] is '*': an XRANGE reply, [[id, [field, value, ...]], ...].
    # Each message is read in place, its fields kept as the RESP of their
    # array (messages.pyx decodes them when asked); an element of any
    # other layout is built generically first.
    cdef const char *p = r.data()
    cdef Py_ssize_t end = r.data_end(), i = pos[0], le, start, fstart, vl
    cdef long long n, m, k, j
    cdef list out = []
    cdef str message_id
    cdef bint plain
    le = _crlf(p, i + 1, end)
    n = trusted_int(p, i + 1, le)
    i = le + 2
    for k in range(n):
        start = i
        # "*2\r\n$": an array of exactly two, an id first
        plain = p[i] == 42 and p[i + 1] == 50 and p[i + 2] == 13 and p[i + 4] == 36
        if plain:
            le = _crlf(p, i + 5, end)
            vl = trusted_int(p, i + 5, le)
            plain = vl >= 0
        if plain:
            message_id = PyUnicode_DecodeUTF8(p + le + 2, vl, "replace")
            i = le + 2 + vl + 2
            plain = p[i] == 42
        if plain:
            fstart = i
            le = _crlf(p, i + 1, end)
            m = trusted_int(p, i + 1, le)
            i = le + 2
            plain = m >= 0
            j = 0
            while plain and j < m:
                if p[i] != 36:
                    plain = False
                    break
                le = _crlf(p, i + 1, end)
                vl = trusted_int(p, i + 1, le)
                if vl < 0:
                    plain = False
                    break
                i = le + 2 + vl + 2
                j += 1
        if plain:
            out.append(_message(message_id, PyBytes_FromStringAndSize(p + fstart, i - fstart)))
        else:
            pos[0] = start
            out.append(_message_of(r.value_at(pos)))
            i = pos[0]
    pos[0] = i
    return out


cdef Entry _read_entry(RespReader r, Py_ssize_t *pos, EntryParser parser):
    # [id, [k1, v1, ...]] (or CLAIM's [id, fields, idle, deliveries]),
    # read in place. Any other layout is built generically and judged by
    # parser.parse_item, which gives the same answer, only slower.
    cdef const char *p = r.data()
    cdef Py_ssize_t end = r.data_end(), i = pos[0], le, fstart, kl = 0, vl
    cdef const char *key = NULL
    cdef long long n, m, k
    cdef Span raw, rc, oid
    cdef FieldRole role
    cdef bint other = False
    cdef str entry_id
    cdef object fields, extra = None
    if p[i] != 42:
        return parser.parse_item(r.value_at(pos))
    le = _crlf(p, i + 1, end)
    n = trusted_int(p, i + 1, le)
    i = le + 2
    if (n != 2 and n != 4) or p[i] != 36:
        return parser.parse_item(r.value_at(pos))
    # the entry id
    le = _crlf(p, i + 1, end)
    kl = trusted_int(p, i + 1, le)
    if kl < 0:
        return parser.parse_item(r.value_at(pos))
    entry_id = PyUnicode_DecodeUTF8(p + le + 2, kl, "replace")
    i = le + 2 + kl + 2
    # the fields: a flat array of blob strings, or nil for a deleted entry
    raw.p = rc.p = oid.p = NULL
    raw.n = rc.n = oid.n = -1
    if p[i] == 42:
        fstart = i
        le = _crlf(p, i + 1, end)
        m = trusted_int(p, i + 1, le)
        i = le + 2
        if m < 0:
            fields = None
        else:
            for k in range(m):
                if p[i] != 36:
                    return parser.parse_item(r.value_at(pos))
                le = _crlf(p, i + 1, end)
                vl = trusted_int(p, i + 1, le)
                if vl < 0:
                    return parser.parse_item(r.value_at(pos))
                if k % 2 == 0:
                    kl = vl
                    key = p + le + 2
                else:
                    role = parser.field_role(key, kl)
                    if role == FIELD_INPUT:
                        raw.p = p + le + 2
                        raw.n = vl
                    elif role == FIELD_RETRY:
                        rc.p = p + le + 2
                        rc.n = vl
                    elif role == FIELD_ORIGINAL:
                        oid.p = p + le + 2
                        oid.n = vl
                    else:
                        other = True
                i = le + 2 + vl + 2
            if m % 2 == 1:
                # A key without a value: the generic rules decide.
                return parser.parse_item(r.value_at(pos))
            # The fields stay as their RESP bytes; Entry.fields reads them
            # only if someone asks.
            fields = PyBytes_FromStringAndSize(p + fstart, i - fstart)
    elif p[i] == 95 or (p[i] == 36 and p[i + 1] == 45):  # _ or $-1: nil
        fields = None
        i = _crlf(p, i + 1, end) + 2
    else:
        return parser.parse_item(r.value_at(pos))
    pos[0] = i
    if n == 4:
        extra = (r.value_at(pos), r.value_at(pos))
    return parser.parse_parts(entry_id, fields, raw, rc, oid, extra, True, other)
