# cython: language_level=3
"""lbs's compiled core: RESP encoding and the lbs-input codec.

Private: import the public names from ``lbs``.
"""

include "errors.pyx"
include "buffer.pyx"
include "packer.pyx"
include "inputs.pyx"

#: True when this module was built with LBS_DEBUG=1 (invariant checks on).
DEBUG_BUILD = bool(LBS_DEBUG)
