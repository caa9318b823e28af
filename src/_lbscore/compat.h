/* What the core needs from Python's C API beyond the limited API, with the
 * limited-API equivalent used when setup.py builds with LBS_LIMITED_API=1
 * (Py_LIMITED_API defined). A regular build uses the CPython macros and
 * the buffer protocol.
 *
 * - PyBytes_AS_STRING / PyBytes_GET_SIZE are macros outside the limited
 *   API; there the exported functions do the same (with a type check).
 * - The buffer protocol joined the limited API in 3.11; an abi3 build for
 *   3.10 reads a memoryview by copying it into a bytes object. */
#ifndef LBS_COMPAT_H
#define LBS_COMPAT_H

#if defined(Py_LIMITED_API)
#  ifndef PyBytes_AS_STRING
#    define PyBytes_AS_STRING(o) PyBytes_AsString(o)
#  endif
#  ifndef PyBytes_GET_SIZE
#    define PyBytes_GET_SIZE(o) PyBytes_Size(o)
#  endif
#endif

#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 < 0x030B0000
#  define LBS_HAVE_BUFFER 0
#else
#  define LBS_HAVE_BUFFER 1
#endif

/* The bytes of a C-contiguous memoryview of format "B" (what
 * memoryview(data).cast("B") gives), held until lbs_byteview_release. */
typedef struct {
    const char *buf;
    Py_ssize_t len;
#if LBS_HAVE_BUFFER
    Py_buffer view;
#else
    PyObject *copy;
#endif
} lbs_byteview;

static int lbs_byteview_get(PyObject *mv, lbs_byteview *v) {
#if LBS_HAVE_BUFFER
    if (PyObject_GetBuffer(mv, &v->view, PyBUF_SIMPLE) < 0)
        return -1;
    v->buf = (const char *)v->view.buf;
    v->len = v->view.len;
#else
    v->copy = PyObject_CallMethod(mv, "tobytes", NULL);
    if (v->copy == NULL)
        return -1;
    v->buf = PyBytes_AsString(v->copy);
    v->len = PyBytes_Size(v->copy);
    if (v->buf == NULL || v->len < 0) {
        Py_CLEAR(v->copy);
        return -1;
    }
#endif
    return 0;
}

static void lbs_byteview_release(lbs_byteview *v) {
#if LBS_HAVE_BUFFER
    PyBuffer_Release(&v->view);
#else
    Py_CLEAR(v->copy);
#endif
}

#endif /* LBS_COMPAT_H */
