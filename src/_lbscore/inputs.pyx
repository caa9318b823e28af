# The `lbs-input` field of a load-balancer stream entry.
#
# Wire format (shared with the Go client, so mixed fleets interoperate):
#     {"DataStreamName": "<name>", "Info": {...}}
# JSON, UTF-8. Info may be absent or null on the wire (Go's nil map); it
# decodes to an empty dict. We write the compact form Go's json.Marshal
# writes and read any JSON; the compiled fast path takes any JSON whitespace
# too, so a Python producer's plain json.dumps (", " and ": ") or an
# indented document is not left to json.loads. A lone surrogate escape
# anywhere (\ud800 without its low half) makes a document malformed: UTF-8
# cannot encode the str json.loads makes of it (_lone_surrogate).

import json as _json

cdef object _dumps = _json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
cdef object _loads = _json.loads


def encode_input(name, info=None):
    """Encode the ``lbs-input`` JSON value for data stream ``name``.

    Raises lbs.InvalidInputError for an empty or non-str name, an ``info``
    that is not a dict, or an ``info`` that JSON cannot represent.
    """
    if not isinstance(name, str) or not name:
        raise _invalid_input(f"data stream name must be a non-empty str, got {name!r}")
    if info is None:
        info = {}
    elif not isinstance(info, dict):
        raise _invalid_input(f"info must be a dict, got {type(info).__name__}")
    try:
        text = _dumps({"DataStreamName": name, "Info": info})
    except (TypeError, ValueError) as exc:
        raise _invalid_input(f"info is not JSON-serialisable: {exc}") from exc
    except RecursionError:  # deeper than Python's own recursion limit
        raise _invalid_input(_too_deep(name)) from None
    raw = (<str>text).encode("utf-8")
    if _json_depth(raw, len(raw)) > JSON_MAX_NESTING:
        raise _invalid_input(_too_deep(name))
    return raw


# How deep a document may nest ([ and {, the document's own object counted),
# whatever Python runs: json's own limit is Python's recursion limit on 3.10-3.12
# and none on 3.13, so without this a 3.13 producer could write what a 3.12
# consumer dead-letters. Go's encoding/json allows 10,000.
cdef enum:
    JSON_MAX_NESTING = 512


_DECODE_TOO_DEEP = f"lbs-input is not valid JSON: nested too deeply (deeper than {JSON_MAX_NESTING} levels)"


def _too_deep(name):
    return f"info of data stream {name!r:.100} is nested too deeply (JSON deeper than {JSON_MAX_NESTING} levels)"


from libc.string cimport memcmp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.float cimport PyFloat_FromString
from cpython.long cimport PyLong_FromString
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8

cdef const char* _HEAD = b'{"DataStreamName":"'
cdef Py_ssize_t _HEAD_LEN = 19
cdef const char* _INFO = b',"Info":'
cdef Py_ssize_t _INFO_LEN = 8

# A tiny JSON reader for the documents our encoder and Go's json.Marshal
# write (and json.dumps's, through _decode_compacted): no whitespace, strings
# without escapes or control characters, nesting up to _JSON_MAX_DEPTH,
# integers of up to _INT_DIGITS_ALWAYS_CONVERTED characters. For anything
# else it answers _NOT_FAST and json (the general path) decides, so both
# paths give the same value or the fast one steps aside. Numbers follow
# json's own rules: an integer is int(), anything with a fraction or an
# exponent is float() of the same text.
cdef object _NOT_FAST = object()
cdef enum:
    _JSON_MAX_DEPTH = 32
    # int() refuses integers of more digits than sys.get_int_max_str_digits()
    # with a ValueError, and that limit is never below 640.
    _INT_DIGITS_ALWAYS_CONVERTED = 640


cdef inline Py_ssize_t _string_end(const char* p, Py_ssize_t n, Py_ssize_t j) noexcept:
    # The closing quote of a string whose text starts at j, or -1 when it has
    # an escape or a control character (json must judge it) or no end.
    cdef unsigned char c
    while j < n:
        c = <unsigned char>p[j]
        if c == 34:  # "
            return j
        if c == 92 or c < 32:
            return -1
        j += 1
    return -1


cdef object _json_string(const char* p, Py_ssize_t n, Py_ssize_t* i):
    # p[i[0]] is the opening quote.
    cdef Py_ssize_t j = _string_end(p, n, i[0] + 1)
    if j < 0:
        return _NOT_FAST
    try:
        s = PyUnicode_DecodeUTF8(p + i[0] + 1, j - i[0] - 1, NULL)
    except UnicodeDecodeError:
        return _NOT_FAST
    i[0] = j + 1
    return s


cdef object _json_number(const char* p, Py_ssize_t n, Py_ssize_t* i):
    # -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?  (json's NUMBER_RE)
    cdef Py_ssize_t j = i[0], start = i[0]
    cdef bint is_float = False
    cdef long long v
    if j < n and p[j] == 45:  # -
        j += 1
    if j < n and p[j] == 48:  # a leading 0 stands alone
        j += 1
    else:
        j = digits_end(p, n, j)
        if j < 0:
            return _NOT_FAST
    if j < n and p[j] == 46:  # .
        j = digits_end(p, n, j + 1)
        if j < 0:
            return _NOT_FAST
        is_float = True
    if j < n and (p[j] == 101 or p[j] == 69):  # e E
        j += 1
        if j < n and (p[j] == 43 or p[j] == 45):
            j += 1
        j = digits_end(p, n, j)
        if j < 0:
            return _NOT_FAST
        is_float = True
    i[0] = j
    if is_float:
        return PyFloat_FromString(PyBytes_FromStringAndSize(p + start, j - start))
    if parse_int64(p, start, j, &v) == 0:
        return v
    if j - start > _INT_DIGITS_ALWAYS_CONVERTED:
        return _NOT_FAST  # int() may refuse it with a ValueError: json decides
    text = PyBytes_FromStringAndSize(p + start, j - start)  # beyond int64
    return PyLong_FromString(text, NULL, 10)


# Object keys repeat across documents ("user", "shard", ...): a small cache
# hands out the same str for the same key bytes instead of decoding them
# again (json.loads does the same within one document).
cdef enum:
    _KEY_SLOTS = 512
    _KEY_MAX = 40
cdef list _key_cache = [None] * _KEY_SLOTS


cdef object _json_key(const char* p, Py_ssize_t n, Py_ssize_t* i):
    # p[i[0]] is the opening quote of an object key.
    cdef Py_ssize_t a = i[0] + 1, j = _string_end(p, n, a), size
    cdef size_t h
    cdef const char* cached_p
    if j < 0:
        return _NOT_FAST
    if j - a > _KEY_MAX or j == a:
        return _json_string(p, n, i)
    h = (<size_t>(j - a) * 31 + <unsigned char>p[a] * 7 + <unsigned char>p[j - 1] * 3
         + <unsigned char>p[a + (j - a) // 2]) % _KEY_SLOTS
    cached = _key_cache[h]
    if cached is not None:
        cached_p = PyUnicode_AsUTF8AndSize(cached, &size)
        if size == j - a and memcmp(cached_p, p + a, size) == 0:
            i[0] = j + 1
            return cached
    k = _json_string(p, n, i)
    if k is not _NOT_FAST:
        _key_cache[h] = k
    return k


cdef inline int _json_more(const char* p, Py_ssize_t n, Py_ssize_t* i, char close) noexcept:
    # After an object member or an array element: 1 past a comma (another
    # follows), 0 past ``close`` (the end), -1 for anything else.
    if i[0] < n:
        if p[i[0]] == 44:  # ,
            i[0] += 1
            return 1
        if p[i[0]] == close:
            i[0] += 1
            return 0
    return -1


cdef object _json_value(const char* p, Py_ssize_t n, Py_ssize_t* i, int depth):
    cdef char c
    cdef int more
    cdef dict d
    cdef list a
    if i[0] >= n or depth > _JSON_MAX_DEPTH:
        return _NOT_FAST
    c = p[i[0]]
    if c == 34:  # "
        return _json_string(p, n, i)
    if c == 123:  # {
        d = {}
        i[0] += 1
        if i[0] < n and p[i[0]] == 125:  # }
            i[0] += 1
            return d
        while True:
            if i[0] >= n or p[i[0]] != 34:
                return _NOT_FAST
            k = _json_key(p, n, i)
            if k is _NOT_FAST or i[0] >= n or p[i[0]] != 58:  # :
                return _NOT_FAST
            i[0] += 1
            v = _json_value(p, n, i, depth + 1)
            if v is _NOT_FAST:
                return _NOT_FAST
            d[k] = v
            more = _json_more(p, n, i, 125)  # }
            if more <= 0:
                return d if more == 0 else _NOT_FAST
    if c == 91:  # [
        a = []
        i[0] += 1
        if i[0] < n and p[i[0]] == 93:  # ]
            i[0] += 1
            return a
        while True:
            v = _json_value(p, n, i, depth + 1)
            if v is _NOT_FAST:
                return _NOT_FAST
            a.append(v)
            more = _json_more(p, n, i, 93)  # ]
            if more <= 0:
                return a if more == 0 else _NOT_FAST
    if c == 116 and n - i[0] >= 4 and memcmp(p + i[0], b"true", 4) == 0:
        i[0] += 4
        return True
    if c == 102 and n - i[0] >= 5 and memcmp(p + i[0], b"false", 5) == 0:
        i[0] += 5
        return False
    if c == 110 and n - i[0] >= 4 and memcmp(p + i[0], b"null", 4) == 0:
        i[0] += 4
        return None
    if c == 45 or is_digit(c):
        return _json_number(p, n, i)
    return _NOT_FAST


cdef tuple _decode_canonical(const char* p, Py_ssize_t n):
    # The exact shape our encoder and Go's json.Marshal write:
    #     {"DataStreamName":"<name>"}  or  {"DataStreamName":"<name>","Info":<value>}
    # with a name free of escapes. Returns (name, info, None), or None for
    # anything else (whitespace, escapes, other key order, extra keys, bad
    # bytes): _decode_fast tries once more without the whitespace, then the
    # general path decodes or rejects it with a reason. Both paths give the
    # same answer for every input they both accept.
    cdef Py_ssize_t i, j
    cdef object name, info
    if n < _HEAD_LEN + 2 or memcmp(p, _HEAD, _HEAD_LEN) != 0:
        return None
    j = _string_end(p, n, _HEAD_LEN)  # an escape or a control: the general path judges
    if j <= _HEAD_LEN:
        return None
    try:
        name = PyUnicode_DecodeUTF8(p + _HEAD_LEN, j - _HEAD_LEN, NULL)
    except UnicodeDecodeError:
        return None
    i = j + 1
    if i == n - 1 and p[i] == 125:  # }
        return (name, {}, None)
    if n - i < _INFO_LEN + 2 or memcmp(p + i, _INFO, _INFO_LEN) != 0 or p[n - 1] != 125:
        return None
    i += _INFO_LEN
    if n - i == 5 and memcmp(p + i, b"null}", 5) == 0:
        return (name, {}, None)
    if p[i] != 123:  # Info must be an object: the general path gives the reason
        return None
    info = _json_value(p, n - 1, &i, 0)
    if info is _NOT_FAST or i != n - 1:
        return None
    return (name, info, None)


cdef inline bint _is_ws(char c) noexcept:
    # RFC 8259's whitespace, and json's: space, LF, CR, tab (not a form feed,
    # not a no-break space).
    return c == 32 or c == 10 or c == 13 or c == 9


cdef inline bint _is_structural(char c) noexcept:
    return c == 123 or c == 125 or c == 91 or c == 93 or c == 44 or c == 58  # { } [ ] , :


cdef Py_ssize_t _compact(const char* p, Py_ssize_t n, char* out) noexcept:
    # p into out (n bytes of room) without the whitespace between its
    # tokens; returns how many bytes that leaves, or -1 when p has none to
    # take out, whitespace no JSON has (between two values: `1 2`), or
    # anything _decode_canonical refuses in a string (an escape, a control
    # character), so json can have it at once.
    #
    # JSON allows whitespace only around the six structural characters and
    # the whole text (RFC 8259, section 2), and any amount there means
    # nothing: so when every run outside strings touches one of those or an
    # end, the text without them is JSON exactly when p is, of the same
    # value. Strings are copied as they are.
    cdef Py_ssize_t i = 0, m = 0, j
    cdef char c
    while i < n:
        c = p[i]
        if _is_ws(c):
            j = i + 1
            while j < n and _is_ws(p[j]):
                j += 1
            if m > 0 and j < n and not _is_structural(out[m - 1]) and not _is_structural(p[j]):
                return -1
            i = j
            continue
        out[m] = c
        m += 1
        i += 1
        if c == 34:  # a string: up to its closing quote
            while i < n:
                c = p[i]
                if c == 92 or <unsigned char>c < 32:  # \ or a control character
                    return -1
                out[m] = c
                m += 1
                i += 1
                if c == 34:
                    break
    return -1 if m == n else m


cdef enum:
    # Documents up to this size are compacted on the stack.
    _COMPACT_ON_STACK = 512


cdef tuple _decode_compacted(const char* p, Py_ssize_t n):
    # _decode_canonical of p without its whitespace: what json.dumps writes
    # with its default separators (", " and ": ") or an indent.
    cdef char stack[_COMPACT_ON_STACK]
    cdef char* out = stack
    cdef bytes heap
    cdef Py_ssize_t m
    if n > _COMPACT_ON_STACK:
        heap = PyBytes_FromStringAndSize(NULL, n)
        out = PyBytes_AS_STRING(heap)
    m = _compact(p, n, out)
    if m < 0:
        return None
    return _decode_canonical(out, m)


cdef inline tuple _decode_fast(const char* p, Py_ssize_t n):
    # The compact form as it comes, anything else once more without its
    # whitespace: the compact form pays nothing for the second try.
    cdef tuple fast = _decode_canonical(p, n)
    if fast is None:
        fast = _decode_compacted(p, n)
    return fast


cdef tuple decode_input_ptr(const char* p, Py_ssize_t n):
    # decode_input_c for bytes the caller holds in a buffer (the RESP reader):
    # no bytes object unless the fast path steps aside.
    cdef tuple fast = _decode_fast(p, n)
    if fast is not None:
        return fast
    return decode_input_c(PyBytes_FromStringAndSize(p, n))


# Why a document with a lone surrogate is malformed, not delivered: UTF-8 (the
# wire format's encoding) cannot encode such a str, so no key, lock or script
# argument can carry the name; Redis's Lua (cjson) refuses the whole document,
# so its name is never locked; and an lbs Producer refuses to write one.
_LONE = "a lone surrogate, which UTF-8 cannot encode and Redis's scripts cannot decode"


cdef str _lone_surrogate_reason(const char* p, Py_ssize_t n, Py_ssize_t at, object name):
    cdef str escape
    try:
        (<str>name).encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"lbs-input DataStreamName {name!r:.100} contains {exc.object[exc.start:exc.end]!r} "
                f"at position {exc.start}: {_LONE}")
    escape = PyUnicode_DecodeUTF8(p + at, 6, "replace")
    return (f"lbs-input contains the JSON escape {escape} at byte {at} (in its Info, or another member "
            f"than its DataStreamName): {_LONE}")


cdef tuple decode_input_c(object raw):
    # Returns (name, info, None) or (None, None, reason): bad input is data,
    # not an exception, so one malformed entry never aborts a batch.
    cdef object doc, name, info
    cdef tuple fast
    cdef bytes encoded  # what the depth scan reads: the caller's bytes, or a str's UTF-8
    cdef Py_ssize_t at
    if type(raw) is bytes:
        fast = _decode_fast(<bytes>raw, len(<bytes>raw))
        if fast is not None:
            return fast
    if isinstance(raw, (bytes, bytearray, memoryview)):
        encoded = bytes(raw)
        try:
            raw = encoded.decode("utf-8")
        except UnicodeDecodeError as exc:
            return (None, None, f"lbs-input is not UTF-8: {exc}")
    elif raw is None:
        return (None, None, "entry has no lbs-input field")
    elif not isinstance(raw, str):
        return (None, None, f"lbs-input has unexpected type {type(raw).__name__}")
    else:
        try:
            encoded = (<str>raw).encode("utf-8")
        except UnicodeEncodeError as exc:
            return (None, None, f"lbs-input is not UTF-8: it contains {exc.object[exc.start:exc.end]!r} "
                                f"at position {exc.start}, {_LONE}")
    if _json_depth(encoded, len(encoded)) > JSON_MAX_NESTING:
        return (None, None, _DECODE_TOO_DEEP)
    try:
        doc = _loads(raw)
    except ValueError as exc:
        return (None, None, f"lbs-input is not valid JSON: {exc}")
    except RecursionError:  # within the limit, but the caller's stack was already deep
        return (None, None, _DECODE_TOO_DEEP)
    if not isinstance(doc, dict):
        return (None, None, f"lbs-input is not a JSON object but {type(doc).__name__}")
    name = (<dict>doc).get("DataStreamName")
    if not isinstance(name, str) or not name:
        return (None, None, "lbs-input has no non-empty string DataStreamName")
    info = (<dict>doc).get("Info")
    if info is None:
        info = {}
    elif not isinstance(info, dict):
        return (None, None, f"lbs-input Info is not a JSON object but {type(info).__name__}")
    # Only this path can give a lone surrogate (the fast one refuses escapes).
    at = _lone_surrogate(encoded, len(encoded))
    if at >= 0:
        return (None, None, _lone_surrogate_reason(encoded, len(encoded), at, name))
    return (name, info, None)


def decode_input(raw):
    """Decode an ``lbs-input`` value (bytes or str) into ``(name, info)``.

    Raises lbs.InvalidInputError, whose message is the reason, when the
    value is not the JSON object the wire format prescribes, or holds a
    lone surrogate (a ``\\ud800`` escape without its low half) anywhere.
    """
    name, info, reason = decode_input_c(raw)
    if reason is not None:
        raise _invalid_input(reason)
    return name, info


def try_decode_input(raw):
    """Like decode_input, but returns ``(name, info, reason)`` instead of raising.

    ``reason`` is None on success; otherwise name and info are None. This is
    the form batch readers use, so one bad entry cannot abort the others.
    """
    return decode_input_c(raw)
