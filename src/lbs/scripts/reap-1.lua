--[[
  Recovery's fast path: find assignments whose lock deadline has passed and
  whose lock is gone, without waiting for Redis to get round to expiring it.

  KEYS[1]  the deadline index, {<service>-input}:deadlines (entry id scored
           by its lock's deadline in server milliseconds)

  ARGV[1]  the lock key prefix, lock:{<service>-input}:
  ARGV[2]  most entries to look at (the oldest deadlines first)

  Output: the entry ids whose deadline passed and whose lock no longer
  exists. They stay in the index until requeue-4.lua handles them.

  EXISTS on a lock past its TTL deletes it on the spot (and fires its
  expired keyspace event), however many other volatile keys the active
  expire cycle is busy with. An overdue entry whose lock still exists (a
  heartbeat landed after the deadline was read) gets its deadline moved
  to the lock's real expiry.

  Events: expired on locks found past their TTL.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
local gone = {}
for i = 1, #due do
  local lock = ARGV[1] .. due[i]
  if redis.call('EXISTS', lock) == 1 then
    local pttl = redis.call('PTTL', lock)
    if pttl < 0 then
      redis.call('ZREM', KEYS[1], due[i])  -- a lock without expiry is not ours to time
    else
      redis.call('ZADD', KEYS[1], now + pttl, due[i])
    end
  else
    gone[#gone + 1] = due[i]
  end
end
return gone
