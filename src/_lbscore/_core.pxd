# One compilation unit, as in asyncpg's protocol: every concern's .pxd is
# included here so calls between concerns stay C calls.
include "debug.pxd"
include "compat.pxd"

include "errors.pxd"
include "buffer.pxd"
include "packer.pxd"
include "jsonscan.pxd"
include "inputs.pxd"
include "entries.pxd"
include "messages.pxd"
include "reader.pxd"
include "entryparse.pxd"
include "pipeline.pxd"
include "held.pxd"
include "xadds.pxd"
include "columns.pxd"
