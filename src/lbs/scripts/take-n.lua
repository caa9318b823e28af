--[[
  Take the locks of a batch of freshly read assignments, one fencing token each.

  KEYS[1]        the service's fencing counter, {<service>-input}:fence
  KEYS[2]        the deadline index, {<service>-input}:deadlines (a sorted
                 set: entry id scored by its lock's deadline, server ms)
  KEYS[3..n+2]   lock keys, lock:{<service>-input}:<entry id>

  ARGV[1]        consumer id (the lock value is "<token>:<consumer id>")
  ARGV[2]        lock TTL in milliseconds
  ARGV[3..n+2]   the entry ids behind the locks, one per key

  Output: a list with one element per lock key: the fencing token (> 0) when
  the lock was taken, or the current holder's value (a string) when the key
  was already held by someone.

  Tokens come from one INCRBY for the batch, so they are unique and only
  grow, across every consumer of the service.

  Events: none besides the keys it writes.
]]
local n = #KEYS - 2
local last = redis.call('INCRBY', KEYS[1], n)
local first = last - n
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local out = {}
for i = 1, n do
  local token = first + i
  local ok = redis.call('SET', KEYS[i + 2], token .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2])
  if ok then
    out[i] = token
    redis.call('ZADD', KEYS[2], deadline, ARGV[i + 2])
  else
    out[i] = redis.call('GET', KEYS[i + 2]) or ''
  end
end
return out
