--[[
  Recovery's fast path: find the assignments of consumers whose lease is
  gone, without waiting for Redis to get round to expiring it. It takes
  nothing over: every entry found goes back through requeue-6.lua (mode
  "absent"), which writes a fresh entry under a new id, so an entry id is
  only ever pending to the consumer that read it.

  KEYS[1]  the consumer deadline index, {<service>-input}:deadlines (consumer
           id scored by the server time, ms, by which it heartbeats again)
  KEYS[2]  the load-balancer stream, <service>-input
  KEYS[3]  {<service>-input}:reaped: the server time (ms) of the last call,
           by any recoverer

  ARGV[1]  consumer group
  ARGV[2]  the lease key prefix, {<service>-input}:lease: (a consumer's
           lease is this plus its id; same slot, not declared)
  ARGV[3]  most pending entries to look at in this call (over all consumers)
  ARGV[4]  stall threshold (ms): a longer gap since the last call means the
           server (or every recoverer) was stopped
  ARGV[5]  grace (ms, the lease TTL): after such a gap, every overdue
           consumer gets this long to heartbeat again before it is judged
  ARGV[6]  optional: the tokens hashes' prefix, {<service>-input}:tokens:
           (a consumer's is this plus its id; same slot, not declared; see
           read-3.lua's ARGV[5]): a dead consumer removed from the index
           with nothing pending loses its hash. "" or absent: none kept

  Output: {gone, next, stamp[, holders, deadlines]}
    gone     ids of the entries pending to dead holders (within the budget),
             oldest deadline's holder first: requeue-6.lua puts them back
             into the LBS
    next     ms until the earliest deadline left in KEYS[1]; -1 when empty
    stamp    what this call wrote to KEYS[3] (the server time, ms, as text):
             a caller that moves KEYS[3] on without the script (SET ...
             IFEQ) compares with it
    holders  (when some consumer was due and not after a stall) each gone
             entry's holder, in gone's order
    deadlines  {consumer, deadline ms, ...}: the KEYS[1] score of each holder
             in holders, before this call moved it (the journal's time to recover)

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
      budget) are returned in gone; with nothing pending it is removed from
      the index; it stays due until then, and a later call sees the rest.

  A call that finds nothing due (the index empty, or its earliest deadline
  still ahead: an idle fleet's every call) reads one ZRANGE, writes KEYS[3]
  and returns.

  Preconditions, checked before anything is written; a violation returns
  "LBSKEY <key> ..." with nothing written:
    * KEYS[1] does not exist or is a sorted set;
    * KEYS[3] does not exist or is a string holding a time.
  (XPENDING on the LBS goes through pcall: no group or no stream is nothing
  pending; a lease key of another type counts as alive without a TTL:
  removed from the index, left to the scan.)

  Events: expired on leases found past their TTL.
]]
--#include _checks
--#include _time
local bad = misfit(KEYS[1], 'zset', 'the consumer deadline index')
if bad then return redis.error_reply(bad) end
local kind = redis.call('TYPE', KEYS[3])['ok']
local last = kind == 'string' and tonumber(redis.call('GET', KEYS[3])) or nil
if kind ~= 'none' and not last then
  return redis.error_reply('LBSKEY ' .. KEYS[3] .. ' holds a ' .. kind .. ' that is not a time, not the last reap')
end
local now = time_ms()
local stamp = string.format('%.0f', now)
-- The idle case, one read: nothing due (the index empty or its earliest deadline ahead). Only
-- KEYS[3] is written.
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not head[2] or tonumber(head[2]) > now then
  redis.call('SET', KEYS[3], stamp)
  return {{}, head[2] and tonumber(head[2]) - now or -1, stamp}
end

local records = ARGV[6] ~= nil and ARGV[6] ~= '' and ARGV[6] or nil

local function next_due()
  local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return earliest[2] and math.max(0, tonumber(earliest[2]) - now) or -1
end

local budget = tonumber(ARGV[3])
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, budget)
redis.call('SET', KEYS[3], stamp)
if last and now - last > tonumber(ARGV[4]) then
  for i = 1, #due do
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), due[i])
  end
  return {{}, next_due(), stamp}
end
local gone, holders, deadlines = {}, {}, {}
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
      gone[#gone + 1] = pending[j][1]
      holders[#holders + 1] = consumer
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
return {gone, next_due(), stamp, holders, deadlines}
