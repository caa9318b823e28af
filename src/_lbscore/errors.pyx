# Exceptions raised by the core are lbs's own (one hierarchy under
# lbs.LbsError). They are looked up lazily, on the error path only, so the
# core has no import-time dependency on the Python package.

cdef object _exc_cache = {}


cdef object _lbs_exception(str name):
    cls = _exc_cache.get(name)
    if cls is None:
        from lbs import exceptions as _exceptions
        cls = getattr(_exceptions, name)
        _exc_cache[name] = cls
    return cls


cdef object _data_error(str message):
    return _lbs_exception("DataError")(message)


cdef object _invalid_input(str message):
    return _lbs_exception("InvalidInputError")(message)


cdef int _internal_error(str message) except -1:
    raise _lbs_exception("InternalError")(message)
