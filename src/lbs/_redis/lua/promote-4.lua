--[[
  Bring parked retries back: every parked copy whose due time has come goes
  into the load-balancer stream as a fresh entry, atomically with its
  removal from the parking stream and the due index. Any number of clients
  call it; each copy comes back exactly once.

  KEYS[1]  the due index, {<service>-input}:due: a sorted set of parked ids,
           each scored by the server time (ms) at which it is due
  KEYS[2]  the parking stream of delayed retries, {<service>-input}:delayed
  KEYS[3]  the load-balancer stream, <service>-input
  KEYS[4]  the waiting index, {<service>-input}:waiting (see _names.lua):
           the names registrations wait for, each scored by the server time
           (ms) at which it is looked at again

  ARGV[1]  most parked copies to move in this call, an integer >= 1 (also
           the most names looked at)
  ARGV[2]  consumer group
  ARGV[3]  the service's key prefix, {<service>-input}: (same slot)

  The waiting sweep: a name whose holder released it puts its oldest waiter
  back at once (done-n.lua, requeue-6.lua). One whose holder vanished
  without releasing it (its entry trimmed or deleted by hand while pending,
  acked by a peer that knows no names) would keep its waiters forever, so
  each name due in KEYS[4] is looked at: held by an entry still pending, or
  its last waiter put back still in the LBS: looked at again 10 s later;
  otherwise its oldest waiter still in the LBS goes back into it now.

  Preconditions, checked before the first write; a violation writes nothing
  and returns the error "LBSKEY <key> holds a <type>, not <what>":
    * KEYS[1] does not exist or is a sorted set ("the due index"), KEYS[4]
      does not exist or is a sorted set ("the waiting index"); when neither
      exists nothing waits, and the call returns at once;
    * when a copy is due: KEYS[2] does not exist or is a stream ("a
      stream"), and KEYS[3] does not exist or is a stream ("the
      load-balancer stream").
  A malformed ARGV[1] gives "ERR lbs promote-4: ..." (nothing written).

  For each id due (score <= TIME in ms, earliest first, at most ARGV[1]):
    * the parked entry exists: XADD its fields (the copy requeue-6.lua made:
      the entry's fields, retry count, original id) to KEYS[3], XDEL it
      from KEYS[2], ZREM it from KEYS[1];
    * it is gone (deleted by hand, or not a stream id): ZREM it;
    * it has more than 7,000 values (only a hand-made entry can; Lua's
      unpack cannot pass it): left parked, rescored to +inf (never due), so
      it neither blocks the others nor is lost.
  Each id is handled whole before the next, so a call that fails part-way
  leaves every copy either moved or parked.

  Output: {moved, vanished, next, stuck, names}
    moved     copies put back into KEYS[3]
    vanished  ids removed from KEYS[1] whose parked entry was gone
    next      ms until the next copy is due; 0 when ARGV[1] copies were
              due (call again now); -1 when nothing more is parked
    stuck     copies too wide to move, rescored to +inf
    names     waiting registrations put back by the sweep

  Events: xadd on KEYS[3]; xdel on KEYS[2]; zrem (or zadd) on KEYS[1]; the
  sweep's as in done-n.lua.
]]
--#include _checks
--#include _names
--#include _time
local MAX_COPY = 7000

local batch = tonumber(ARGV[1])
if not batch or batch < 1 or batch ~= math.floor(batch) then
  return redis.error_reply('ERR lbs promote-4: ARGV[1] must be an integer >= 1, got ' .. tostring(ARGV[1]))
end
local parked, waiting = redis.call('TYPE', KEYS[1])['ok'] ~= 'none', redis.call('TYPE', KEYS[4])['ok'] ~= 'none'
if not parked and not waiting then return {0, 0, -1, 0, 0} end  -- nothing parked, nobody waits
local bad = misfit(KEYS[1], 'zset', 'the due index') or misfit(KEYS[4], 'zset', 'the waiting index')
if bad then return redis.error_reply(bad) end

local now_ms = time_ms()
local now = string.format('%.0f', now_ms)

-- The waiting sweep: names whose holder vanished without releasing them.
local names = 0
if waiting then
  local prefix = ARGV[3]
  for _, name in ipairs(redis.call('ZRANGE', KEYS[4], '-inf', now, 'BYSCORE', 'LIMIT', 0, batch)) do
    local v = redis.pcall('GET', prefix .. 'name:' .. name)
    local live = type(v) == 'table'  -- a key of another type: left alone
    if type(v) == 'string' then
      local h, _, copy = name_holder(v)
      live = (h ~= '' and name_pending(KEYS[3], ARGV[2], h)) or
             (copy ~= '' and #redis.call('XRANGE', KEYS[3], copy, copy) > 0)
    end
    if live then
      redis.call('ZADD', KEYS[4], 'XX', now_ms + NAME_RECHECK_MS, name)
    else
      names = names + name_promote(prefix, KEYS[3], name, now_ms)
    end
  end
end
if not parked then return {0, 0, -1, 0, names} end
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, batch)
if #due > 0 then
  bad = misfit(KEYS[2], 'stream', 'a stream') or misfit(KEYS[3], 'stream', 'the load-balancer stream')
  if bad then return redis.error_reply(bad) end
end
local moved, vanished, stuck = 0, 0, 0
for i = 1, #due do
  local id = due[i]
  local found = redis.pcall('XRANGE', KEYS[2], id, id)
  if found.err or #found == 0 then
    redis.call('ZREM', KEYS[1], id)
    vanished = vanished + 1
  elseif #found[1][2] > MAX_COPY then
    redis.call('ZADD', KEYS[1], '+inf', id)
    stuck = stuck + 1
  else
    redis.call('XADD', KEYS[3], '*', unpack(found[1][2]))
    redis.call('XDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    moved = moved + 1
  end
end

local next = -1
if #due == batch then
  next = 0
else
  local first = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if #first > 0 and tonumber(first[2]) < math.huge then
    next = tonumber(first[2]) - tonumber(now)
  end
end
return {moved, vanished, next, stuck, names}
