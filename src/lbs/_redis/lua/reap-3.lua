--[[
  Recovery's fast path: find the assignments of consumers that stopped
  heartbeating, without waiting for Redis to get round to expiring their
  locks.

  KEYS[1]  the consumer deadline index, {<service>-input}:consumers (consumer
           id scored by the server time, ms, by which it heartbeats again)
  KEYS[2]  the load-balancer stream, <service>-input
  KEYS[3]  {<service>-input}:reaped: the server time (ms) of the last call,
           by any recoverer

  ARGV[1]  consumer group
  ARGV[2]  the lock key prefix, lock:{<service>-input}:
  ARGV[3]  most pending entries to look at in this call (over all consumers)
  ARGV[4]  stall threshold (ms): a longer gap since the last call means the
           server (or every recoverer) was stopped
  ARGV[5]  grace (ms, the lock TTL): after such a gap, every overdue consumer
           gets this long to heartbeat again before it is judged

  Output: the ids of overdue consumers' pending entries whose lock no longer
  exists. They stay pending until requeue-6.lua handles them.

  After a stall (SIGSTOP of the server, a long pause of every recoverer) all
  deadlines and locks lapse at once, though their holders live: a live
  holder's heartbeat finds its lost locks and re-queues them itself, with no
  retry counted. So a call that finds the last one further back than the
  threshold only moves every overdue consumer's deadline to now + grace and
  returns nothing; a consumer that is really dead is judged one grace later.

  Overdue consumers are taken oldest deadline first. Each one's pending
  entries are listed (XPENDING ... <consumer>) and every lock is looked up
  with PTTL, which deletes a lock past its TTL on the spot (and fires its
  expired keyspace event), however many other volatile keys the active
  expire cycle is busy with. Then the consumer's place in the index:
    * nothing pending: removed (its next read adds it again);
    * some locks still live (a late heartbeat, or a death part-way through
      one): rescored to the earliest of their expiries, so the next call
      comes when the next of them can be gone;
    * only gone locks seen: left due; once these are re-queued the next
      call sees the rest of its pending entries;
    * only locks without a TTL: removed; they are not ours to time (the scan
      still covers them).
  A live consumer finds its own lost locks in its heartbeat, so the index
  only has to bring back the work of consumers that stopped.

  Precondition, checked before anything else: KEYS[1] does not exist or is
  a sorted set; otherwise the error "LBSKEY <KEYS[1]> holds a <type>, not
  the consumer deadline index", with nothing written. (XPENDING on the LBS
  goes through pcall: no group or no stream is nothing pending; the other
  writes, ZADD / ZREM on KEYS[1], cannot fail once it is a sorted set.)

  Events: expired on locks found past their TTL.
]]
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'zset' then
  return redis.error_reply('LBSKEY ' .. KEYS[1] .. ' holds a ' .. kind .. ', not the consumer deadline index')
end
kind = redis.call('TYPE', KEYS[3])['ok']
local last = kind == 'string' and tonumber(redis.call('GET', KEYS[3])) or nil
if kind ~= 'none' and not last then
  return redis.error_reply('LBSKEY ' .. KEYS[3] .. ' holds a ' .. kind .. ' that is not a time, not the last reap')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local budget = tonumber(ARGV[3])
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, budget)
redis.call('SET', KEYS[3], string.format('%.0f', now))
if last and now - last > tonumber(ARGV[4]) then
  for i = 1, #due do
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), due[i])
  end
  return {}
end
local gone = {}
for i = 1, #due do
  if budget <= 0 then break end
  local consumer = due[i]
  local pending = redis.pcall('XPENDING', KEYS[2], ARGV[1], '-', '+', budget, consumer)
  if type(pending) ~= 'table' then pending = {} end  -- no group or no stream: nothing pending
  budget = budget - #pending
  local soonest, dead = nil, 0
  for j = 1, #pending do
    local id = pending[j][1]
    local pttl = redis.call('PTTL', ARGV[2] .. id)
    if pttl == -2 then
      gone[#gone + 1] = id
      dead = dead + 1
    elseif pttl >= 0 and (soonest == nil or pttl < soonest) then
      soonest = pttl
    end
  end
  if soonest then
    redis.call('ZADD', KEYS[1], now + soonest, consumer)
  elseif dead == 0 then
    redis.call('ZREM', KEYS[1], consumer)
  end
end
return gone
