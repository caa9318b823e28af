# Decimal digits, read and written: the core's one copy of each.
#
# Reading: RESP lengths and integers (reader.pyx, columns.pyx), retry counts
# (entries.pyx), JSON numbers (inputs.pyx) and stream entry ids
# (columns.pyx). Writing: RESP length headers and integer arguments
# (buffer.pyx), lock values and IDMP producer ids (held.pyx, xadds.pyx).
# All inline: every caller is on a hot path, and this file is included
# before the rest of the core.

from libc.stdint cimport int64_t


cdef inline bint is_digit(char c) noexcept nogil:
    return c >= 48 and c <= 57  # 0-9


cdef inline Py_ssize_t digits_end(const char *p, Py_ssize_t n, Py_ssize_t j) noexcept:
    # The end of the run of digits at j, or -1 when there is none.
    if j >= n or not is_digit(p[j]):
        return -1
    while j < n and is_digit(p[j]):
        j += 1
    return j


cdef inline int parse_int64(const char *p, Py_ssize_t a, Py_ssize_t b, long long *out) noexcept:
    # p[a:b] as -?[0-9]+ within int64, strictly; 0 on success, -1 otherwise.
    cdef bint neg = False
    cdef unsigned long long v = 0, limit = 9223372036854775807ULL
    cdef unsigned int d
    if a < b and p[a] == 45:  # -
        neg = True
        limit += 1
        a += 1
    if a >= b:
        return -1
    while a < b:
        if not is_digit(p[a]):
            return -1
        d = <unsigned int>(p[a] - 48)
        if v > (limit - d) // 10:
            return -1
        v = v * 10 + d
        a += 1
    if neg:
        out[0] = -<long long>(v - 1) - 1  # -(2**63) without overflow
    else:
        out[0] = <long long>v
    return 0


cdef inline long long trusted_int(const char *p, Py_ssize_t a, Py_ssize_t b) noexcept:
    # parse_int64 of text already proved to be an int64 (a RESP length or
    # integer the reader's check accepted).
    cdef long long v = 0
    parse_int64(p, a, b, &v)
    return v


cdef inline int stream_id_parts(const char *p, Py_ssize_t n, unsigned long long *ms,
                                unsigned long long *seq) noexcept:
    # A stream entry id "<ms>-<seq>" (or "<ms>": seq 0) into its two
    # numbers; -1 if it is not one.
    cdef Py_ssize_t i = 0
    cdef unsigned long long a = 0, b = 0
    if n == 0:
        return -1
    while i < n and p[i] != 45:
        if not is_digit(p[i]):
            return -1
        a = a * 10 + <unsigned long long>(p[i] - 48)
        i += 1
    if i < n:
        i += 1
        if i == n:
            return -1
        while i < n:
            if not is_digit(p[i]):
                return -1
            b = b * 10 + <unsigned long long>(p[i] - 48)
            i += 1
    ms[0] = a
    seq[0] = b
    return 0


cdef enum:
    # Room format_int64 may need: a sign and 19 digits.
    INT64_DIGITS = 20


cdef inline int format_int64(int64_t v, char *out) noexcept:
    # The decimal digits of v into out (INT64_DIGITS bytes or more); returns how many.
    cdef char tmp[INT64_DIGITS]
    cdef int i = 0, n = 0
    cdef unsigned long long u
    if v < 0:
        out[n] = c'-'
        n += 1
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    if u == 0:
        tmp[0] = c'0'
        i = 1
    while u > 0:
        tmp[i] = <char>(c'0' + u % 10)
        u //= 10
        i += 1
    while i > 0:
        i -= 1
        out[n] = tmp[i]
        n += 1
    return n
