--[[
  Floor the service's fencing counter at the server's clock: what the
  Lua-free read (lbs._redis.reads) sends once on each new connection before
  it takes tokens with INCRBY, and again when INCRBY answers a value below
  10^15 (the counter was lost). A counter that does not exist (a restart
  without persistence, an eviction) or went back (a failover to a replica
  that missed the last tokens) moves up to the server time in microseconds,
  so tokens never go backwards (_fence.lua).

  KEYS[1]  the service's fencing counter, {<service>-input}:fence
  No ARGV.

  Preconditions: KEYS[1] does not exist, or is a string holding a plain
  decimal integer below 2^53 ("LBSKEY <key> ..." otherwise, nothing
  written).

  Output: the counter's value after the call (an integer).

  Events: set on KEYS[1] when it moved.
]]
--#include _fence
--#include _time
local failed, current = fence_check(KEYS[1], 1)
if failed then return failed end
local _, t = time_ms()
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
if current and current >= floor then return current end
return fence_take(KEYS[1], current, 0, t)
