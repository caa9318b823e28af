--[[
  Release the names of finished entries that registrations wait for: the
  rare half of the Lua-free done (lbs._redis.done). There a batch is
  finished with XACKDEL and one "DELEX <name key> IFEQ <entry id>" per name,
  which frees every name nobody waits for; a name whose holder key held
  anything else ("<id>+": registrations wait) comes here, so that its
  oldest waiter goes back into the LBS (_names.lua's name_release).

  KEYS[1]  the load-balancer stream, <service>-input
  ARGV[1]  the service's key prefix, {<service>-input}: (same slot; the
           name keys are not declared)
  ARGV[2..] pairs: a DataStreamName, then the id of the finished entry that
           held it

  For each pair: a holder key holding the id is deleted; one holding
  "<id>+" hands the name on to the oldest waiter still in the LBS (a fresh
  entry, no retry counted; the key becomes "+<new id>", or is deleted with
  the last waiter); anything else (another holder, none, a key of another
  type) is left alone. Each name is handled whole before the next.

  A malformed call (no prefix, an odd number of values) gives
  "ERR lbs release-1: ..." and writes nothing.

  Output: how many waiters went back into the LBS.

  Events: del on a released holder key; lpop, xadd, xdel as in done-n.lua.
]]
--#include _names
--#include _time
if #KEYS ~= 1 or not ARGV[1] or ARGV[1] == '' or (#ARGV - 1) % 2 ~= 0 then
  return redis.error_reply('ERR lbs release-1: expected 1 key, the key prefix and name/id pairs')
end
local now_ms = time_ms()
local put_back = 0
for i = 2, #ARGV - 1, 2 do
  put_back = put_back + name_release(ARGV[1], KEYS[1], ARGV[i], ARGV[i + 1], now_ms)
end
return put_back
