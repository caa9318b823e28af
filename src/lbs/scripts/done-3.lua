--[[
  Finish an assignment: release our lock, ack and delete the entry, atomically.

  KEYS[1]  the load-balancer stream, <service>-input
  KEYS[2]  the assignment's lock key
  KEYS[3]  the deadline index, {<service>-input}:deadlines

  ARGV[1]  consumer group
  ARGV[2]  entry id
  ARGV[3]  our lock value ("<token>:<consumer id>")
  ARGV[4]  "1" to use XACKDEL (Redis >= 8.2), "0" for XACK + XDEL

  Output:
    1  done: the lock was ours; released; entry acked and deleted
    2  lock expired: nobody held it, the entry was still pending and is now
       acked and deleted (no one else processed it)
    3  lock lost: the lock is someone else's, or the entry had already been
       handed on (re-queued); nothing was acked. The data stream may be
       processed twice.

  Events: del on the lock key (outcome 1).
]]
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[3] then
  return 3
end
if holder then
  redis.call('DEL', KEYS[2])
end
redis.call('ZREM', KEYS[3], ARGV[2])
local acked
if ARGV[4] == '1' then
  local r = redis.pcall('XACKDEL', KEYS[1], ARGV[1], 'IDS', 1, ARGV[2])
  acked = type(r) == 'table' and r[1] == 1
else
  local r = redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
  acked = r == 1
  redis.call('XDEL', KEYS[1], ARGV[2])
end
if holder then
  return 1
end
if acked then
  return 2
end
return 3
