# The `lbs-input` field of a load-balancer stream entry.
#
# Wire format (shared with the Go client, so mixed fleets interoperate):
#     {"DataStreamName": "<name>", "Info": {...}}
# compact JSON, UTF-8. Info may be absent or null on the wire (Go's nil map);
# it decodes to an empty dict.

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
    return (<str>text).encode("utf-8")


from libc.string cimport memcmp
import json.scanner as _json_scanner

# json's C scanner (what json.loads runs underneath), called directly: one
# value at a given index, no whitespace regex, no decode() wrapper.
cdef object _scan_once = _json_scanner.make_scanner(_json.JSONDecoder())
cdef const char* _HEAD = b'{"DataStreamName":"'
cdef Py_ssize_t _HEAD_LEN = 19
cdef const char* _INFO = b',"Info":'
cdef Py_ssize_t _INFO_LEN = 8


cdef tuple _decode_canonical(bytes raw):
    # The exact shape our encoder and Go's json.Marshal write:
    #     {"DataStreamName":"<name>"}  or  {"DataStreamName":"<name>","Info":<value>}
    # with a name free of escapes. Returns (name, info, None), or None for
    # anything else (whitespace, escapes, other key order, extra keys, bad
    # bytes), which the general path then decodes or rejects with a reason.
    # Both paths give the same answer for every input they both accept.
    cdef const char* p = raw
    cdef Py_ssize_t n = len(raw), i, j
    cdef unsigned char c
    cdef object name, info, text
    if n < _HEAD_LEN + 2 or memcmp(p, _HEAD, _HEAD_LEN) != 0:
        return None
    j = _HEAD_LEN
    while j < n:
        c = <unsigned char>p[j]
        if c == 34:  # "
            break
        if c == 92 or c < 32:  # backslash or control: let the general path judge
            return None
        j += 1
    if j == _HEAD_LEN or j >= n:
        return None
    try:
        name = raw[_HEAD_LEN:j].decode("utf-8")
    except UnicodeDecodeError:
        return None
    i = j + 1
    if i == n - 1 and p[i] == 125:  # }
        return (name, {}, None)
    if n - i < _INFO_LEN + 2 or memcmp(p + i, _INFO, _INFO_LEN) != 0 or p[n - 1] != 125:
        return None
    i += _INFO_LEN
    if n - i == 3 and p[i] == 123 and p[i + 1] == 125:  # {}}
        return (name, {}, None)
    if n - i == 5 and memcmp(p + i, b"null}", 5) == 0:
        return (name, {}, None)
    if p[i] != 123:  # Info must be an object: the general path gives the reason
        return None
    try:
        text = raw[i:n - 1].decode("utf-8")
        info, end = _scan_once(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) or not isinstance(info, dict):
        return None
    return (name, info, None)


cdef tuple decode_input_c(object raw):
    # Returns (name, info, None) or (None, None, reason): bad input is data,
    # not an exception, so one malformed entry never aborts a batch.
    cdef object doc, name, info
    cdef tuple fast
    if type(raw) is bytes:
        fast = _decode_canonical(<bytes>raw)
        if fast is not None:
            return fast
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return (None, None, f"lbs-input is not UTF-8: {exc}")
    elif raw is None:
        return (None, None, "entry has no lbs-input field")
    elif not isinstance(raw, str):
        return (None, None, f"lbs-input has unexpected type {type(raw).__name__}")
    try:
        doc = _loads(raw)
    except ValueError as exc:
        return (None, None, f"lbs-input is not valid JSON: {exc}")
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
    return (name, info, None)


def decode_input(raw):
    """Decode an ``lbs-input`` value (bytes or str) into ``(name, info)``.

    Raises lbs.InvalidInputError, whose message is the reason, when the
    value is not the JSON object the wire format prescribes.
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
