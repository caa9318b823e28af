--[[
  Recovery's fast path: find the assignments of consumers whose lease is
  gone, without waiting for Redis to get round to expiring it, and adopt as
  many as the caller has room for on the spot.

  KEYS[1]  the consumer deadline index, {<service>-input}:consumers (consumer
           id scored by the server time, ms, by which it heartbeats again)
  KEYS[2]  the load-balancer stream, <service>-input
  KEYS[3]  {<service>-input}:reaped: the server time (ms) of the last call,
           by any recoverer
  KEYS[4]  the service's fencing counter, {<service>-input}:fence (as in
           read-3.lua: seeded from the clock when it does not exist)

  ARGV[1]  consumer group
  ARGV[2]  the lease key prefix, {<service>-input}:lease: (a consumer's
           lease is this plus its id; same slot, not declared)
  ARGV[3]  most pending entries to look at in this call (over all consumers)
  ARGV[4]  stall threshold (ms): a longer gap since the last call means the
           server (or every recoverer) was stopped
  ARGV[5]  grace (ms, the lease TTL): after such a gap, every overdue
           consumer gets this long to heartbeat again before it is judged
  ARGV[6]  optional, adoption: the calling consumer's id ("" or absent: no
           adoption, every entry found is returned for requeue-6.lua)
  ARGV[7]  most entries to adopt (the caller's free room), an integer >= 0
  ARGV[8]  the caller's lease value: nothing is adopted unless its lease
           (ARGV[2] .. ARGV[6]) holds it (adopted entries are held by it)
  ARGV[9]  the queued sets' prefix, {<service>-input}:queued: (same slot,
           not declared): a dead holder's set says which entries it merely
           held (see read-3.lua, ARGV[6])
  ARGV[10] "1" when the caller queues what it takes (the notification API):
           adopted entries go into its own queued set, merely held
  ARGV[11] optional: the tokens hashes' prefix, {<service>-input}:tokens:
           (a consumer's is this plus its id; same slot, not declared; see
           read-3.lua's ARGV[11]): adopted entries are recorded in the
           adopter's under their token ("<ARGV[8]>|<id> <id> ..."); a dead consumer removed from the
           index with nothing pending loses its hash. "": none kept

  Output: {adopted, tokens, gone, trimmed, next[, holders, deadlines]}
    adopted  the entries adopted, {{id, fields, idle ms, deaths}, ...} (the
             shape of XREADGROUP CLAIM's entries): each is now pending to the
             caller, held by its lease, as a read leaves it. deaths: the
             deaths counted against the entry while it was pending, its
             delivery count less one.
    tokens   one per adopted entry: its fencing token (an integer; one for
             the call, shared by what it adopts)
    gone     ids of dead holders' entries that were not adopted (no room, or
             no adoption asked): requeue-6.lua puts them back into the LBS
    trimmed  how many adoptable entries had been deleted from the stream:
             XCLAIM dropped their pending references (Redis >= 7.0)
    next     ms until the earliest deadline left in KEYS[1]; -1 when empty
    holders  (when some consumer was due and not after a stall) each adopted
             entry's holder, then each gone entry's, in their orders
    deadlines  {consumer, deadline ms, ...}: the KEYS[1] score of each holder
             in holders, before this call moved it (the journal's time to recover)

  Adoption is a re-queue and a read in one step, without copying the entry:
  XCLAIM moves it to the caller with RETRYCOUNT its delivery count, plus one
  when the death counts against it (it was not in its holder's queued set:
  its handler was running; see requeue-6.lua's ARGV[5]), and it leaves the
  holder's queued set. requeue-6.lua carries the deaths in the delivery
  count into the copy when the entry goes back later.

  After a stall (SIGSTOP of the server, a long pause of every recoverer) all
  deadlines and leases lapse at once, though their holders live: a live
  holder's heartbeat finds its lost lease and re-queues its entries itself,
  with no retry counted. So a call that finds the last one further back than
  the threshold only moves every overdue consumer's deadline to now + grace
  and returns nothing; a consumer that is really dead is judged one grace
  later.

  Overdue consumers are taken oldest deadline first. Each one's lease is
  looked up with PTTL (one per consumer, not per entry), which deletes a
  lease past its TTL on the spot (and fires its expired keyspace event),
  however many other volatile keys the active expire cycle is busy with:
    * lease alive: rescored to its expiry, so the next call comes when it
      can be gone (a late heartbeat moves it further);
    * lease without a TTL (set by hand): removed; not ours to time (the
      scan still covers its entries);
    * lease gone: its pending entries (XPENDING ... <consumer>, within the
      budget) are adopted or returned in gone; with nothing pending it is
      removed from the index; with more than the budget it stays due, and
      the next call sees the rest.

  A call that finds nothing due (the index empty, or its earliest deadline
  still ahead: an idle fleet's every call) reads one ZRANGE, writes KEYS[3]
  and returns; adoption's preconditions and ACL probes run only when some
  consumer is due.

  Preconditions, checked before anything is written; a violation returns
  "LBSKEY <key> ..." with nothing written:
    * KEYS[1] does not exist or is a sorted set;
    * KEYS[3] does not exist or is a string holding a time;
    * with adoption, when some consumer is due: KEYS[4] as read-3.lua
      requires, for ARGV[7] tokens; the caller's queued set (ARGV[10]) does
      not exist or is a set.
  A user the ACL denies one of adoption's writes (XCLAIM, SET, ZADD, SADD,
  SREM) is not refused: nothing is adopted, every entry found is returned
  in gone. (XPENDING on the LBS goes through pcall: no group or no stream is
  nothing pending; a holder's queued set of another type counts as empty
  and is left alone; a lease key of another type counts as alive without a
  TTL: removed from the index, left to the scan.)

  Events: expired on leases found past their TTL; with adoption, xclaim on
  the LBS.
]]
--#include _checks
--#include _fence
--#include _time
local bad = misfit(KEYS[1], 'zset', 'the consumer deadline index')
if bad then return redis.error_reply(bad) end
local kind = redis.call('TYPE', KEYS[3])['ok']
local last = kind == 'string' and tonumber(redis.call('GET', KEYS[3])) or nil
if kind ~= 'none' and not last then
  return redis.error_reply('LBSKEY ' .. KEYS[3] .. ' holds a ' .. kind .. ' that is not a time, not the last reap')
end
local now, t = time_ms()
-- The idle case, one read: nothing due (the index empty or its earliest deadline ahead). Only
-- KEYS[3] is written, so adoption's preconditions and ACL probes wait until something is due.
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not head[2] or tonumber(head[2]) > now then
  redis.call('SET', KEYS[3], string.format('%.0f', now))
  return {{}, {}, {}, 0, head[2] and tonumber(head[2]) - now or -1}
end

local adopter = ARGV[6] ~= nil and ARGV[6] ~= '' and ARGV[6] or nil
local records = ARGV[11] ~= nil and ARGV[11] ~= '' and ARGV[11] or nil
local room = adopter and tonumber(ARGV[7]) or 0
local mine = adopter and ARGV[10] == '1' and (ARGV[9] .. adopter) or nil
local fence_value = false
if room > 0 and redis.pcall('GET', ARGV[2] .. adopter) ~= ARGV[8] then
  room = 0  -- the caller's own lease is not (or no longer) the one it holds: it may hold nothing
end
if room > 0 then
  local fence_error
  fence_error, fence_value = fence_check(KEYS[4], room)
  if fence_error then return fence_error end
  bad = misfit(mine, 'set', 'a queued set')
  if bad then return redis.error_reply(bad) end
  -- A user who may look but not take: nothing adopted, everything re-queued.
  local writes = {{'XCLAIM', KEYS[2], ARGV[1], adopter, '0', '0-1'}, {'SET', KEYS[4], '1'},
                  {'ZADD', KEYS[1], 'NX', '1', adopter}, {'SREM', ARGV[9] .. adopter, '0-1'}}
  if mine then writes[#writes + 1] = {'SADD', mine, '0-1'} end
  for _, cmd in ipairs(writes) do
    if not redis.acl_check_cmd(unpack(cmd)) then
      room = 0
      break
    end
  end
end

local function next_due()
  local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return earliest[2] and math.max(0, tonumber(earliest[2]) - now) or -1
end

local budget = tonumber(ARGV[3])
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, budget)
redis.call('SET', KEYS[3], string.format('%.0f', now))
if last and now - last > tonumber(ARGV[4]) then
  for i = 1, #due do
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), due[i])
  end
  return {{}, {}, {}, 0, next_due()}
end
local gone, gone_by, deadlines = {}, {}, {}
-- Adoptable: {id, idle ms, delivery count, holder}
local take = {}
for i = 1, #due do
  if budget <= 0 then break end
  local consumer = due[i]
  local pttl = redis.pcall('PTTL', ARGV[2] .. consumer)
  if type(pttl) ~= 'number' or pttl == -1 then
    redis.call('ZREM', KEYS[1], consumer)  -- no TTL (set by hand) or not a number: not ours to time
  elseif pttl >= 0 then
    redis.call('ZADD', KEYS[1], now + pttl, consumer)  -- alive: due again when its lease can be gone
  else
    local pending = redis.pcall('XPENDING', KEYS[2], ARGV[1], '-', '+', budget, consumer)
    if type(pending) ~= 'table' then pending = {} end  -- no group or no stream: nothing pending
    budget = budget - #pending
    for j = 1, #pending do
      local p = pending[j]
      if #take < room then
        take[#take + 1] = {p[1], p[3], p[4], consumer}
      else
        gone[#gone + 1] = p[1]
        gone_by[#gone_by + 1] = consumer
      end
    end
    if #pending > 0 then
      deadlines[#deadlines + 1] = consumer
      deadlines[#deadlines + 1] = redis.call('ZSCORE', KEYS[1], consumer)
    else
      redis.call('ZREM', KEYS[1], consumer)
      if records then redis.call('DEL', records .. consumer) end
    end
  end
end
if #take == 0 then
  return {{}, {}, gone, 0, next_due(), gone_by, deadlines}
end

-- Adoption. A death counts against an entry its holder was running, not one
-- it merely held (in its queued set); the count is the entry's delivery count.
-- (MSETEX and SMISMEMBER instead of a SET and a SISMEMBER per entry measured
-- no faster: the cost is in XCLAIM and in the Lua tables of the replies.)
local deliveries = {}  -- delivery count after adoption -> ids
local idle, deaths, held_by = {}, {}, {}
for _, a in ipairs(take) do
  local id, holder_set = a[1], ARGV[9] .. a[4]
  local queued = redis.pcall('SISMEMBER', holder_set, id) == 1  -- a key of another type: not queued
  if queued then redis.call('SREM', holder_set, id) end
  local count = a[3] + (queued and 0 or 1)
  deliveries[count] = deliveries[count] or {}
  table.insert(deliveries[count], id)
  idle[id], deaths[id], held_by[id] = a[2], count - 1, a[4]
end
local adopted, holders = {}, {}
for count, ids in pairs(deliveries) do
  for s = 1, #ids, 500 do
    local args = {KEYS[2], ARGV[1], adopter, 0}
    for i = s, math.min(s + 499, #ids) do args[#args + 1] = ids[i] end
    args[#args + 1], args[#args + 2] = 'RETRYCOUNT', count
    local claimed = redis.call('XCLAIM', unpack(args))
    for _, e in ipairs(claimed) do
      adopted[#adopted + 1] = {e[1], e[2], idle[e[1]], deaths[e[1]]}
      holders[#holders + 1] = held_by[e[1]]
    end
  end
end
local n = #adopted
if n == 0 then
  return {{}, {}, gone, #take, next_due(), gone_by, deadlines}
end
for i = 1, #gone_by do holders[#holders + 1] = gone_by[i] end
local token = fence_take(KEYS[4], fence_value, 1, t) + 1
local tokens, ids = {}, {}
for i = 1, n do
  tokens[i] = token
  ids[i] = adopted[i][1]
end
if records then
  redis.pcall('HSET', records .. adopter, string.format(fence_digits, token),
              ARGV[8] .. '|' .. table.concat(ids, ' '))
end
redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[5]), adopter)
if mine then
  for s = 1, n, 500 do
    local ids = {}
    for i = s, math.min(s + 499, n) do ids[#ids + 1] = adopted[i][1] end
    redis.call('SADD', mine, unpack(ids))
  end
end
return {adopted, tokens, gone, #take - n, next_due(), holders, deadlines}
