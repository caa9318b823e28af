"""Build the compiled core, ``_lbscore._core``.

Metadata lives in pyproject.toml; this file only declares the extension and
its build modes, chosen by environment variables at build time:

  (neither)       the release build: -O2, no debug information and a
                  stripped symbol table (Python's own CFLAGS carry -g, which
                  tripled the wheel), as the published wheels are built.
  LBS_DEBUG=1     line tracing, Cython annotation (HTML beside the .pyx),
                  -O0 -g, and the core's debug-only invariant checks
                  (the LBS_DEBUG C macro, see src/_lbscore/debug.h).
  LBS_SANITIZE=1  AddressSanitizer + UndefinedBehaviorSanitizer (run the
                  tests with LD_PRELOAD=$(gcc -print-file-name=libasan.so)),
                  with Python's debug information kept for the reports.
  LBS_LIMITED_API=1
                  Python's limited API (stable ABI) from 3.10 on: one
                  _core.abi3.so, in a wheel tagged cp310-abi3, for every
                  CPython >= 3.10. Opt-in, not what the published wheels
                  use: issue 21 measured it at ~4% more client instructions
                  per assignment (2-68% more per core call), so the
                  per-version build stays the default. compat.h holds what
                  the core needs to build both ways.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() not in ("", "0", "false", "no")


DEBUG = _flag("LBS_DEBUG")
SANITIZE = _flag("LBS_SANITIZE")
LIMITED_API = _flag("LBS_LIMITED_API")

define_macros = []
extra_compile_args = ["-O2"]
extra_link_args = []
directives = {
    "language_level": 3,
    "freethreading_compatible": True,
    "embedsignature": True,
}
if DEBUG:
    define_macros += [("LBS_DEBUG", "1"), ("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    extra_compile_args = ["-O0", "-g3"]
    directives.update(linetrace=True, boundscheck=True, wraparound=True)
if not (DEBUG or SANITIZE):
    # Last on the command line, so they win over -g in Python's CFLAGS.
    extra_compile_args += ["-g0"]
    extra_link_args += ["-s"]
if SANITIZE:
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    extra_compile_args += flags
    extra_link_args += flags
if LIMITED_API:
    # Cython 3.1+ generates limited-API C when Py_LIMITED_API is defined;
    # CYTHON_LIMITED_API says so explicitly. 0x030A0000: requires-python >= 3.10.
    define_macros += [("Py_LIMITED_API", "0x030A0000"), ("CYTHON_LIMITED_API", "1")]
    # A call outside the limited API is undeclared there: fail the build, not the import.
    extra_compile_args += ["-Werror=implicit-function-declaration"]

# Every compiled module is listed here, and only here.
EXTENSIONS = [
    Extension(
        "_lbscore._core",
        ["src/_lbscore/_core.pyx"],
        include_dirs=["src/_lbscore"],
        define_macros=define_macros,
        extra_compile_args=extra_compile_args,
        extra_link_args=extra_link_args,
        py_limited_api=LIMITED_API,  # the .abi3.so suffix
    ),
]

setup(
    ext_modules=cythonize(
        EXTENSIONS,
        compiler_directives=directives,
        annotate=DEBUG,
        # The generated C differs by mode (line tracing), and a .c left by a
        # build in the other mode looks up to date: always regenerate.
        force=True,
        include_path=["src/_lbscore"],
    ),
    # The wheel's tag must say what the extension needs: cp310-abi3.
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if LIMITED_API else {},
)
