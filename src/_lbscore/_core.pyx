# cython: language_level=3
"""lbs's compiled core: RESP encoding and command batches, the lbs-input codec, LBS entry parsing.

Private: import the public names from ``lbs``.
"""

include "digits.pxi"
include "errors.pyx"
include "buffer.pyx"
include "packer.pyx"
include "jsonscan.pyx"
include "inputs.pyx"
include "entries.pyx"
include "messages.pyx"
include "reader.pyx"
include "entryparse.pyx"
include "pipeline.pyx"
include "held.pyx"
include "xadds.pyx"
include "columns.pyx"

#: True when this module was built with LBS_DEBUG=1 (invariant checks on).
DEBUG_BUILD = bool(LBS_DEBUG)
