--[[
  Finish a batch of assignments: release our locks, ack and delete the
  entries, atomically, in one call.

  KEYS[1]         the load-balancer stream, <service>-input
  KEYS[2..n+1]    the assignments' lock keys

  ARGV[1]          consumer group
  ARGV[2]          "1" to use XACKDEL (Redis >= 8.2), "0" for XACK + XDEL
  ARGV[3]          "1" when this call retries one whose reply was lost (the
                   connection dropped): it may already have run; "0" otherwise
  ARGV[4]          the service's key prefix, {<service>-input}: (one holder
                   per name, _names.lua; same slot, keys not declared): an
                   entry this call acks (outcomes 1, 2) releases its name
                   if it holds it, and the oldest registration waiting for
                   the name goes back into the LBS. "": names untouched
  ARGV[5]          beside a Go fleet: our consumer name; "" otherwise
  ARGV[6..n+5]     our lock values ("<token>:<owner>"), one per lock key
  ARGV[n+6..2n+5]  the entry ids, one per lock key
  ARGV[2n+6..3n+5] the name holder keys of the entries' DataStreamNames,
                   ARGV[4] .. "name:" .. <name>, one per lock key ("" for
                   an entry without one: no name to release); sent whole so
                   that no key is built here per entry

  Beside a Go reference client v0.4 fleet (Config.go_compatible) ARGV[5]
  is our consumer name and, after the name holder keys, come each entry's Go-style
  lock key ("<DataStreamName><MUTEX_KEY_SEP><entry id>", no hash tag:
  single Redis only, as the Go client is): 4n + 5 arguments. Then an entry whose
  lock is ours but that is no longer pending under that name, or whose
  Go-style lock holds another name (a Go consumer took it), gets outcome
  5; a Go-style lock holding our name is deleted with our lock, in this
  call, whenever our lock is released or the entry acked.

  Two passes. The first only reads: the locks (one MGET per slice of 500;
  a nil is then told apart by EXISTS: a key of another type counts as
  someone else's garbage) and, for each lock that no longer exists,
  whether its entry is still pending (XPENDING <id> <id> 1; no group or
  no stream: not pending). The second writes: one DEL of our locks per
  slice, then the acks and deletes (slices of 500 keep clear of Lua's
  unpack limit; XACKDEL, XACK and XDEL through pcall, so a vanished group
  or stream fails nothing part-way). Only entries this call acks are
  deleted (XACKDEL does the same): one that is not pending was handed on,
  or requeue-6.lua kept it in the LBS as the record of a dead letter.
  When every lock is ours and no Go fleet is beside us (nearly always),
  the DELs and XACKDELs take their keys and ids straight from KEYS and
  ARGV: nothing is listed or looked at per entry but the lock's value.

  A wrong argument count is an "ERR lbs done-n: ..." error, with nothing
  written. A name's holder key or waiting list of another type is left
  alone (the name is not released; the next registration of it takes it
  over, its entry being no longer pending).

  The consumer deadline index is left alone: the consumer's deadline stays
  its heartbeat's, and recovery drops a consumer with nothing pending.

  Output: one string with one digit per lock key, in their order (one bulk
  reply, not an array of n integers, which costs Redis more to write):
    1  done: the lock was ours; released; entry acked and deleted (when
       it was still pending)
    2  lock expired: nobody held it, the entry was still pending and is now
       acked and deleted (no one else processed it)
    3  lock lost: the lock is someone else's (or a key of another type), or
       it is gone and the entry had already been handed on (re-queued);
       nothing was acked or deleted, the lock key is untouched. The data
       stream may be processed twice.
    4  only when ARGV[3] is "1": the lock does not exist and the entry is
       no longer pending: the call being retried already finished it
       (reported instead of 3); nothing was touched.
    5  only beside a Go fleet: the lock was ours (released) but the entry
       is pending under another consumer, or no longer pending, or its
       Go-style lock holds another name: a Go consumer took it; nothing
       was acked or deleted, its Go-style lock is untouched.
  Beside a Go fleet, outcome 2 needs the Go-style lock absent or ours (a
  Go holder's entry is outcome 3, untouched).

  Events: del on the lock keys (outcomes 1 and 5) and on the Go-style
  locks released; del on a released name's holder key, and lpop, xadd,
  xdel for a waiting registration put back.
]]
--#include _names
--#include _time
local n = #KEYS - 1
local me = ARGV[5] ~= nil and ARGV[5] ~= '' and ARGV[5] or nil
if n < 0 or #ARGV ~= (me and 4 or 3) * n + 5 then
  return redis.error_reply('ERR lbs done-n: expected 1 + n keys and 3n + 5 (4n + 5 beside a Go fleet) '
                           .. 'arguments, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local lbs, group, xackdel, retry = KEYS[1], ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local prefix = ARGV[4] ~= '' and ARGV[4] or nil
-- Entry i: its lock key KEYS[i + 1], lock value ARGV[5 + i], id ARGV[I + i], name holder key
-- ARGV[N + i] and, beside a Go fleet, Go-style lock key ARGV[G + i].
local I, N, G = n + 5, 2 * n + 5, 3 * n + 5
local slice = 500
local min = math.min
-- Each entry's outcome; nil while its lock is known to be ours.
local out = {}

-- Pass 1: reads only. One MGET per slice: a lock holding our value is ours, one holding another
-- value someone else's (3); the rest (0: no lock, or a key of another type) are looked at one by
-- one below.
local mixed = false
for s = 1, n, slice do
  local e = min(s + slice - 1, n)
  local got = redis.call('MGET', unpack(KEYS, s + 1, e + 1))
  for i = s, e do
    local holder = got[i - s + 1]
    if holder ~= ARGV[5 + i] then
      out[i] = holder and 3 or 0
      mixed = true
    end
  end
end
-- Every lock ours and no Go fleet (nearly always): the locks to delete are KEYS[2..n+1] and the
-- entries to ack ARGV[I+1..I+n], sent as they are. Otherwise they are listed: dels, ids, and at
-- (each id's entry).
local plain = not mixed and not me
local dels, ids, at, nids = {}, {}, {}, 0
if not plain then
  for i = 1, n do
    local id, o = ARGV[I + i], out[i]
    -- Beside a Go fleet: its Go-style lock, nil when absent, false when a Go consumer (or a key of
    -- another type) holds it.
    local go
    if me and o ~= 3 then
      local key = ARGV[G + i]
      local g = redis.pcall('GET', key)
      if not g then go = nil elseif g == me then go = key else go = false end
    end
    if o == nil then
      out[i] = 1
      dels[#dels + 1] = KEYS[i + 1]
      local p = me and go ~= false and redis.pcall('XPENDING', lbs, group, id, id, 1)
      if me and not (type(p) == 'table' and p[1] and p[1][2] == me) then
        out[i] = 5  -- taken by a Go consumer: released, not acked
      else
        nids = nids + 1
        ids[nids], at[nids] = id, i
        if go then dels[#dels + 1] = go end
      end
    elseif o == 0 then
      if go == false or redis.call('EXISTS', KEYS[i + 1]) == 1 then
        out[i] = 3  -- not a string, or a Go holder's: not our lock, not touched
      else
        local p = redis.pcall('XPENDING', lbs, group, id, id, 1)
        if type(p) == 'table' and p[1] then
          nids = nids + 1
          ids[nids], at[nids] = id, i  -- its outcome is the ack's: 2, or 3
          if go then dels[#dels + 1] = go end
        else
          out[i] = retry and 4 or 3
        end
      end
    end
  end
end

-- Pass 2: writes.
if plain then
  for s = 2, n + 1, slice do
    redis.call('DEL', unpack(KEYS, s, min(s + slice - 1, n + 1)))
  end
  nids = n
else
  for s = 1, #dels, slice do
    redis.call('DEL', unpack(dels, s, min(s + slice - 1, #dels)))
  end
end
for s = 1, nids, slice do
  local e = min(s + slice - 1, nids)
  if xackdel then
    local r = plain and redis.pcall('XACKDEL', lbs, group, 'IDS', e - s + 1, unpack(ARGV, I + s, I + e))
              or redis.pcall('XACKDEL', lbs, group, 'IDS', e - s + 1, unpack(ids, s, e))
    if not plain then
      for j = s, e do
        local i = at[j]
        if out[i] == 0 then
          out[i] = (type(r) == 'table' and r[j - s + 1] == 1) and 2 or 3
        end
      end
    end
  else
    local acked, nacked = {}, 0
    for j = s, e do
      local id, i
      if plain then id, i = ARGV[I + j], j else id, i = ids[j], at[j] end
      local ok = redis.pcall('XACK', lbs, group, id) == 1
      if ok then
        nacked = nacked + 1
        acked[nacked] = id
      end
      if out[i] == 0 then out[i] = ok and 2 or 3 end
    end
    if nacked > 0 then redis.pcall('XDEL', lbs, unpack(acked, 1, nacked)) end
  end
end
-- Names: what this call acked (1, 2) releases its name (and puts the oldest waiter back). One MGET
-- and one DEL per slice (a holder key of another type reads as nil and is left alone); a name
-- with waiters hands on to the oldest.
if prefix then
  local now_ms
  for s = 1, n, slice do
    local e = min(s + slice - 1, n)
    local keys, which, k = {}, {}, 0
    for i = s, e do
      local o, key = out[i], ARGV[N + i]
      if (plain or o == 1 or o == 2) and key ~= '' then
        k = k + 1
        keys[k], which[k] = key, i
      end
    end
    if k > 0 then
      local values, free, nfree = redis.call('MGET', unpack(keys, 1, k)), {}, 0
      for j = 1, k do
        local i, v = which[j], values[j]
        local id = ARGV[I + i]
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
-- One digit per entry.
if plain then return string.rep('1', n) end
return table.concat(out)
