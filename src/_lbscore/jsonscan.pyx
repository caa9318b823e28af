# Scans of JSON text that parse nothing (lbs-input's judge, inputs.pyx): how deep a document
# nests, and where a \uXXXX escape is half of a UTF-16 surrogate pair without its other half.
# Both read the bytes once, outside and inside strings, and never raise.


cdef Py_ssize_t _json_depth(const char* p, Py_ssize_t n):
    # The deepest nesting of [ and { outside strings in p[:n] (no validation).
    cdef Py_ssize_t i = 0, depth = 0, deepest = 0
    cdef char c
    cdef bint quoted = False
    while i < n:
        c = p[i]
        if quoted:
            if c == 92:  # backslash: skip the escaped character
                i += 1
            elif c == 34:
                quoted = False
        elif c == 34:
            quoted = True
        elif c == 91 or c == 123:
            depth += 1
            if depth > deepest:
                deepest = depth
        elif c == 93 or c == 125:
            depth -= 1
        i += 1
    return deepest


cdef inline int _hex4(const char* p, Py_ssize_t n, Py_ssize_t i) noexcept:
    # The value of the four hex digits at p[i:i + 4], or -1.
    cdef int v = 0, d, k
    cdef char c
    if n - i < 4:
        return -1
    for k in range(4):
        c = p[i + k]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return -1
        v = v * 16 + d
    return v


cdef Py_ssize_t _lone_surrogate(const char* p, Py_ssize_t n) noexcept:
    # Where the first \uXXXX escape in a string of the JSON text p[:n] is half
    # of a UTF-16 surrogate pair without its other half (json.loads decodes it
    # to a lone surrogate, a str UTF-8 cannot encode), or -1. A high half
    # followed at once by an escaped low half is one character, as json reads it.
    cdef Py_ssize_t i = 0
    cdef int u
    cdef bint quoted = False
    while i < n:
        if not quoted:
            if p[i] == 34:
                quoted = True
            i += 1
            continue
        if p[i] == 34:
            quoted = False
        elif p[i] == 92:  # backslash
            if i + 1 < n and p[i + 1] == 117:  # \u
                u = _hex4(p, n, i + 2)
                if 0xDC00 <= u <= 0xDFFF:
                    return i
                if 0xD800 <= u <= 0xDBFF:
                    if not (i + 7 < n and p[i + 6] == 92 and p[i + 7] == 117
                            and 0xDC00 <= _hex4(p, n, i + 8) <= 0xDFFF):
                        return i
                    i += 6  # a pair: both escapes skipped
                i += 6
                continue
            i += 1  # the escaped character
        i += 1
    return -1
