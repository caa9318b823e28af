cdef extern from "debug.h":
    # 0 in release builds, 1 when built with LBS_DEBUG=1 (see setup.py).
    const int LBS_DEBUG
