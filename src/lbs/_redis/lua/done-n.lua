--[[
  Finish a batch of assignments held under this consumer's lease: ack and
  delete the entries, release their names, atomically, in one call.

  KEYS[1]          the load-balancer stream, <service>-input
  KEYS[2]          this consumer's lease, {<service>-input}:lease:<consumer id>

  ARGV[1]          consumer group
  ARGV[2]          "1" to use XACKDEL (Redis >= 8.2), "0" for XACK + XDEL
  ARGV[3]          "1" when this call retries one whose reply was lost (the
                   connection dropped): it may already have run; "0" otherwise
  ARGV[4]          the service's key prefix, {<service>-input}: (one holder
                   per name, _names.lua; same slot, keys not declared): an
                   entry this call acks releases its name if it holds it,
                   and the oldest registration waiting for the name goes
                   back into the LBS. "": names untouched
  ARGV[5]          our consumer name in the group
  ARGV[6]          the lease's value the entries were read under
  ARGV[7]          "1" beside a Go reference client v0.4 fleet
                   (Config.go_compatible): each entry's Go-style lock key
                   follows the names; "0" otherwise
  ARGV[8..n+7]     the entry ids
  ARGV[n+8..2n+7]  the name holder keys of the entries' DataStreamNames,
                   ARGV[4] .. "name:" .. <name> ("" for an entry without
                   one: no name to release)
  ARGV[2n+8..3n+7] beside a Go fleet: each entry's Go-style lock key
                   ("<DataStreamName><MUTEX_KEY_SEP><entry id>", no hash
                   tag: single Redis only, as the Go client is)

  An entry is ours while it is pending to ARGV[5] and KEYS[2] holds ARGV[6]:
  recovery takes a consumer's entries only once its lease is gone, so the
  lease alone says it. So the
  lease is read first: when it does not hold ARGV[6] every entry is lost
  (3) and nothing is written. Otherwise each entry is acked (XACKDEL, or
  XACK then XDEL of those acked, in slices of 500, through pcall: a vanished
  group or stream fails nothing part-way); one that was not pending was
  handed on (an operator's claim, a re-queue) and is left alone. Only
  entries this call acks are deleted (XACKDEL does the same): one that is
  not pending was handed on, or requeue-6.lua kept it in the LBS as the
  record of a dead letter. An entry moved to another consumer by hand (an
  XCLAIM while our lease lives) is acked all the same: move entries only
  from consumers whose lease is gone. Beside a Go fleet, whose consumers
  XCLAIM live entries, an entry pending to another consumer or whose
  Go-style lock holds another name is a Go consumer's (5, nothing acked),
  and a Go-style lock holding our name is deleted with the ack.

  A wrong argument count is an "ERR lbs done-n: ..." error, with nothing
  written. A name's holder key or waiting list of another type is left
  alone (the name is not released; the next registration of it takes it
  over, its entry being no longer pending).

  Output: one string with one digit per entry, in their order (one bulk
  reply, not an array of n integers, which costs Redis more to write):
    1  done: acked and deleted
    3  lost: the lease is not the one the entry was read under, or the
       entry was no longer pending; nothing was acked or deleted. The data
       stream may be processed twice.
    4  only when ARGV[3] is "1": the entry is no longer pending: the call
       being retried already finished it (reported instead of 3).
    5  only beside a Go fleet: it is pending to another consumer, or its
       Go-style lock holds another name: a Go consumer took it; nothing was
       acked or deleted.

  Events: del on a released name's holder key and on our Go-style locks,
  and lpop, xadd, xdel for a waiting registration put back.
]]
--#include _names
--#include _time
local n = (#ARGV - 7) / (ARGV[7] == '1' and 3 or 2)
if #KEYS ~= 2 or n < 0 or n ~= math.floor(n) then
  return redis.error_reply('ERR lbs done-n: expected 2 keys and 2n + 7 (3n + 7 beside a Go fleet) arguments, '
                           .. 'got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local lbs, group, xackdel, retry = KEYS[1], ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local prefix = ARGV[4] ~= '' and ARGV[4] or nil
local me, go = ARGV[5], ARGV[7] == '1'
-- Entry i: its id ARGV[I + i], name holder key ARGV[N + i], Go-style lock key ARGV[G + i].
local I, N, G = 7, n + 7, 2 * n + 7
local slice = 500
local min = math.min
if redis.pcall('GET', KEYS[2]) ~= ARGV[6] then
  return string.rep('3', n)  -- not under the lease it was read under: nothing is ours
end
-- Each entry's outcome; nil while it is to be acked.
local out = {}
local ids, at, nids = {}, {}, 0
local go_dels = {}
for i = 1, n do
  local id = ARGV[I + i]
  if go then
    -- A Go consumer's Claim (XCLAIM) and start-up XAUTOCLAIM move an entry whatever our lease says:
    -- ours only while still pending to us and not under another name's Go-style lock.
    local g = redis.pcall('GET', ARGV[G + i])
    local p = redis.pcall('XPENDING', lbs, group, id, id, 1)
    if (g and g ~= me) or (type(p) == 'table' and p[1] and p[1][2] ~= me) then
      out[i] = 5
    elseif g == me then
      go_dels[#go_dels + 1] = ARGV[G + i]
    end
  end
  if out[i] == nil then
    nids = nids + 1
    ids[nids], at[nids] = id, i
  end
end
for s = 1, #go_dels, slice do
  redis.call('DEL', unpack(go_dels, s, min(s + slice - 1, #go_dels)))
end
local lost = retry and 4 or 3
for s = 1, nids, slice do
  local e = min(s + slice - 1, nids)
  if xackdel then
    local r = redis.pcall('XACKDEL', lbs, group, 'IDS', e - s + 1, unpack(ids, s, e))
    for j = s, e do
      out[at[j]] = (type(r) == 'table' and r[j - s + 1] == 1) and 1 or lost
    end
  else
    local acked, nacked = {}, 0
    for j = s, e do
      local ok = redis.pcall('XACK', lbs, group, ids[j]) == 1
      if ok then
        nacked = nacked + 1
        acked[nacked] = ids[j]
      end
      out[at[j]] = ok and 1 or lost
    end
    if nacked > 0 then redis.pcall('XDEL', lbs, unpack(acked, 1, nacked)) end
  end
end
-- Names: what this call acked releases its name (and puts the oldest waiter back). One MGET and
-- one DEL per slice (a holder key of another type reads as nil and is left alone); a name with
-- waiters hands on to the oldest.
if prefix then
  local now_ms
  for s = 1, n, slice do
    local e = min(s + slice - 1, n)
    local keys, which, k = {}, {}, 0
    for i = s, e do
      local key = ARGV[N + i]
      if out[i] == 1 and key ~= '' then
        k = k + 1
        keys[k], which[k] = key, i
      end
    end
    if k > 0 then
      local values, free, nfree = redis.call('MGET', unpack(keys, 1, k)), {}, 0
      for j = 1, k do
        local v, id = values[j], ARGV[I + which[j]]
        if v == id then
          nfree = nfree + 1
          free[nfree] = keys[j]
        elseif v and v == id .. '+' then
          now_ms = now_ms or time_ms()
          name_promote(prefix, lbs, string.sub(keys[j], #prefix + 6), now_ms)
        end
      end
      if nfree > 0 then redis.call('DEL', unpack(free, 1, nfree)) end
    end
  end
end
return table.concat(out)
