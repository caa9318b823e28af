--[[
  Heartbeat: extend every lock still holding our value, and refresh the
  pending-list idle time of the entries behind them.

  KEYS[1]        the load-balancer stream, <service>-input
  KEYS[2]        the consumer deadline index, {<service>-input}:consumers
  KEYS[3..n+2]   lock keys

  ARGV[1]        lock TTL in milliseconds
  ARGV[2]        consumer group
  ARGV[3]        consumer name in the group
  ARGV[4]        "1" in the last call of a tick: move this consumer's
                 deadline to now + TTL; "0" in the others
  ARGV[5..n+4]   the lock values we set ("<token>:<consumer id>"), one per key
  ARGV[n+5..2n+4] the entry ids behind the locks, one per key
  ARGV[2n+5]     optional: one flag per key, "1" to refresh that entry's
                 pending idle time this call, "0" to leave it (absent: all)

  Output: the 1-based positions of the locks that are no longer ours
  (expired, or taken by someone else). Those are not touched.

  One deadline per consumer, not per lock: a tick's calls run in order, so
  when its last call moves the deadline every lock of the tick has been
  extended, and the deadline is at most one tick's duration after the
  earliest of them expires. A consumer that stops heartbeating is found by
  recovery's deadline poller (reap-2.lua); one that lives finds its own
  lost locks in this output.

  XCLAIM ... 0 ... JUSTID to ourselves resets the idle time without bumping
  the delivery counter, so live work never looks idle to an XPENDING IDLE
  scan or to XREADGROUP CLAIM. The client flags a rotating share of the
  entries per call, so each is refreshed well within the scan's min-idle
  without paying for every entry on every tick. Slices of 500 ids stay
  clear of Lua's unpack limit. Errors from XCLAIM (NOGROUP after the group
  vanished) are ignored here: the reader recreates the group.

  Events: none besides the keys it writes.
]]
local n = #KEYS - 2
local ttl = ARGV[1]
local flags = ARGV[2 * n + 5]
local all = flags == nil or flags == ''
local byte = string.byte
local lost = {}
local refresh = {}
for i = 1, n do
  if redis.call('GET', KEYS[i + 2]) == ARGV[i + 4] then
    redis.call('PEXPIRE', KEYS[i + 2], ttl)
    if all or byte(flags, i) == 49 then
      refresh[#refresh + 1] = ARGV[n + 4 + i]
    end
  else
    lost[#lost + 1] = i
  end
end
if ARGV[4] == '1' then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl), ARGV[3])
end
local slice = 500
for s = 1, #refresh, slice do
  local claim = {'XCLAIM', KEYS[1], ARGV[2], ARGV[3], 0}
  for j = s, math.min(s + slice - 1, #refresh) do
    claim[#claim + 1] = refresh[j]
  end
  claim[#claim + 1] = 'JUSTID'
  redis.pcall(unpack(claim))
end
return lost
