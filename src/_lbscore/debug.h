/* LBS_DEBUG switches on invariant checks in the compiled core.
 *
 * setup.py defines it to 1 only when the LBS_DEBUG environment variable is
 * set at build time; release builds see 0 and the C compiler drops every
 * `if LBS_DEBUG:` branch (the pattern of uvloop's includes/debug.h). */
#ifndef LBS_DEBUG
#define LBS_DEBUG 0
#endif
