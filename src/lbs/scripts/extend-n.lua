--[[
  Heartbeat: extend every lock still holding our value, and refresh the
  pending-list idle time of the entries behind them.

  KEYS[1]        the load-balancer stream, <service>-input
  KEYS[2]        the deadline index, {<service>-input}:deadlines
  KEYS[3..n+2]   lock keys

  ARGV[1]        lock TTL in milliseconds
  ARGV[2]        consumer group
  ARGV[3]        consumer name in the group
  ARGV[4..n+3]   the lock values we set ("<token>:<consumer id>"), one per key
  ARGV[n+4..2n+3] the entry ids behind the locks, one per key

  Output: the 1-based positions of the locks that are no longer ours
  (expired, or taken by someone else). Those are not touched.

  The extended locks' deadlines move forward in the deadline index, so
  recovery's deadline poller only ever sees locks nobody heartbeats.

  XCLAIM ... 0 ... JUSTID to ourselves resets the idle time without bumping
  the delivery counter, so live work never looks idle to an XPENDING IDLE
  scan or to XREADGROUP CLAIM. It runs in slices of 500 ids to stay clear of
  Lua's unpack limit. Errors from XCLAIM (NOGROUP after the group vanished)
  are ignored here: the reader recreates the group.

  Events: none besides the keys it writes.
]]
local n = #KEYS - 2
local ttl = ARGV[1]
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl)
local lost = {}
local alive = {}
for i = 1, n do
  if redis.call('GET', KEYS[i + 2]) == ARGV[i + 3] then
    redis.call('PEXPIRE', KEYS[i + 2], ttl)
    alive[#alive + 1] = ARGV[n + 3 + i]
  else
    lost[#lost + 1] = i
  end
end
local slice = 500
for s = 1, #alive, slice do
  local last = math.min(s + slice - 1, #alive)
  local claim = {'XCLAIM', KEYS[1], ARGV[2], ARGV[3], 0}
  local zadd = {'ZADD', KEYS[2]}
  for j = s, last do
    claim[#claim + 1] = alive[j]
    zadd[#zadd + 1] = deadline
    zadd[#zadd + 1] = alive[j]
  end
  claim[#claim + 1] = 'JUSTID'
  redis.pcall(unpack(claim))
  redis.call(unpack(zadd))
end
return lost
