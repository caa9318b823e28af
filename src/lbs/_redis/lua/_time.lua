-- The server's clock, shared by the scripts that score or stamp with it
-- (included where a script says "--#include _time").
--
-- time_ms(): the server time (TIME) in whole milliseconds, exact in a
-- double; then TIME's reply itself ({seconds, microseconds}, what
-- _fence.lua's fence_take seeds a lost counter with). One TIME per call of
-- time_ms: a script that wants one instant for a whole call keeps the first.
local function time_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
