cdef extern from "compat.h":
    # Also maps PyBytes_AS_STRING / PyBytes_GET_SIZE to functions in
    # limited-API builds (LBS_LIMITED_API=1, see setup.py).
    ctypedef struct lbs_byteview:
        const char *buf
        Py_ssize_t len
    # The bytes of memoryview(data).cast("B"), until lbs_byteview_release.
    int lbs_byteview_get(object mv, lbs_byteview *v) except -1
    void lbs_byteview_release(lbs_byteview *v)
