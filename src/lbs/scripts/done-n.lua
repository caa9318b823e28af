--[[
  Finish a batch of assignments: release our locks, ack and delete the
  entries, atomically, in one call.

  KEYS[1]        the load-balancer stream, <service>-input
  KEYS[2..n+1]   the assignments' lock keys

  ARGV[1]        consumer group
  ARGV[2]        "1" to use XACKDEL (Redis >= 8.2), "0" for XACK + XDEL
  ARGV[3..n+2]   our lock values ("<token>:<consumer id>"), one per lock key
  ARGV[n+3..2n+2] the entry ids, one per lock key

  The consumer deadline index is left alone: the consumer's deadline stays
  its heartbeat's, and recovery drops a consumer with nothing pending.

  Output: a list with one code per lock key:
    1  done: the lock was ours; released; entry acked and deleted
    2  lock expired: nobody held it, the entry was still pending and is now
       acked and deleted (no one else processed it)
    3  lock lost: the lock is someone else's, or the entry had already been
       handed on (re-queued); nothing was acked. The data stream may be
       processed twice.

  Events: del on the lock keys (outcome 1).
]]
local n = #KEYS - 1
local group, xackdel = ARGV[1], ARGV[2] == '1'
local out, ids, at = {}, {}, {}
for i = 1, n do
  local lock, id = KEYS[i + 1], ARGV[n + 2 + i]
  local holder = redis.call('GET', lock)
  if holder and holder ~= ARGV[i + 2] then
    out[i] = 3
  else
    if holder then
      redis.call('DEL', lock)
      out[i] = 1
    end
    ids[#ids + 1] = id
    at[#at + 1] = i
  end
end
if #ids > 0 then
  local acked = {}
  if xackdel then
    local r = redis.pcall('XACKDEL', KEYS[1], group, 'IDS', #ids, unpack(ids))
    if type(r) == 'table' then
      for j = 1, #ids do acked[j] = r[j] == 1 end
    end
  else
    for j = 1, #ids do acked[j] = redis.pcall('XACK', KEYS[1], group, ids[j]) == 1 end
    redis.call('XDEL', KEYS[1], unpack(ids))
  end
  for j = 1, #ids do
    local i = at[j]
    if not out[i] then
      out[i] = acked[j] and 2 or 3
    end
  end
end
return out
