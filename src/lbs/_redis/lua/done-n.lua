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
  ARGV[2n+6..3n+5] the entries' DataStreamNames, one per lock key ("" for
                   an entry without one: no name to release)

  Beside a Go reference client v0.4 fleet (Config.go_compatible) ARGV[5]
  is our consumer name and, after the names, come each entry's Go-style
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

  A wrong argument count is an "ERR lbs done-n: ..." error, with nothing
  written. A name's holder key or waiting list of another type is left
  alone (the name is not released; the next registration of it takes it
  over, its entry being no longer pending).

  The consumer deadline index is left alone: the consumer's deadline stays
  its heartbeat's, and recovery drops a consumer with nothing pending.

  Output: a list with one code per lock key:
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
local group, xackdel, retry = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local prefix = ARGV[4] ~= '' and ARGV[4] or nil
-- The values start at ARGV[6], the ids n later, the names n after them, then (beside a Go fleet) the
-- Go-style lock keys.
local base = 5
local out, ids, at = {}, {}, {}
local slice = 500

-- Pass 1: reads only.
local holders = {}
for s = 2, n + 1, slice do
  local got = redis.call('MGET', unpack(KEYS, s, math.min(s + slice - 1, n + 1)))
  for j = 1, #got do holders[s - 2 + j] = got[j] end
end
local dels = {}
for i = 1, n do
  local lock, id, holder = KEYS[i + 1], ARGV[n + base + i], holders[i]
  -- Beside a Go fleet: its Go-style lock, nil when absent, false when a Go consumer (or a key of
  -- another type) holds it.
  local go
  if me then
    local key = ARGV[3 * n + base + i]
    local g = redis.pcall('GET', key)
    if not g then go = nil elseif g == me then go = key else go = false end
  end
  if holder then
    if holder == ARGV[i + base] then
      dels[#dels + 1] = lock
      local p = me and go ~= false and redis.pcall('XPENDING', KEYS[1], group, id, id, 1)
      if me and not (type(p) == 'table' and p[1] and p[1][2] == me) then
        out[i] = 5  -- taken by a Go consumer: released, not acked
      else
        out[i] = 1
        ids[#ids + 1] = id
        at[#at + 1] = i
        if go then dels[#dels + 1] = go end
      end
    else
      out[i] = 3
    end
  elseif go == false or redis.call('EXISTS', lock) == 1 then
    out[i] = 3  -- not a string, or a Go holder's: not our lock, not touched
  else
    local p = redis.pcall('XPENDING', KEYS[1], group, id, id, 1)
    if type(p) == 'table' and p[1] then
      ids[#ids + 1] = id
      at[#at + 1] = i
      if go then dels[#dels + 1] = go end
    else
      out[i] = retry and 4 or 3
    end
  end
end

-- Pass 2: writes.
for s = 1, #dels, slice do
  redis.call('DEL', unpack(dels, s, math.min(s + slice - 1, #dels)))
end
for s = 1, #ids, slice do
  local e = math.min(s + slice - 1, #ids)
  local part = {}
  for j = s, e do part[#part + 1] = ids[j] end
  if xackdel then
    local r = redis.pcall('XACKDEL', KEYS[1], group, 'IDS', #part, unpack(part))
    for j = s, e do
      local i = at[j]
      if not out[i] then
        out[i] = (type(r) == 'table' and r[j - s + 1] == 1) and 2 or 3
      end
    end
  else
    local acked = {}
    for j = s, e do
      if redis.pcall('XACK', KEYS[1], group, ids[j]) == 1 then
        acked[#acked + 1] = ids[j]
        local i = at[j]
        if not out[i] then out[i] = 2 end
      else
        local i = at[j]
        if not out[i] then out[i] = 3 end
      end
    end
    if #acked > 0 then redis.pcall('XDEL', KEYS[1], unpack(acked)) end
  end
end
-- Names: what this call acked releases its name (and puts the oldest waiter back).
-- Read with one MGET and deleted with one DEL per 500 (a holder key of another type reads as nil and
-- is left alone); a name with waiters hands on to the oldest.
if prefix then
  local released = {}
  for i = 1, n do
    if (out[i] == 1 or out[i] == 2) and ARGV[2 * n + base + i] ~= '' then released[#released + 1] = i end
  end
  local now_ms
  for s = 1, #released, slice do
    local e = math.min(s + slice - 1, #released)
    local keys = {}
    for j = s, e do keys[#keys + 1] = prefix .. 'name:' .. ARGV[2 * n + base + released[j]] end
    local values, free = redis.call('MGET', unpack(keys)), {}
    for j = s, e do
      local i, v = released[j], values[j - s + 1]
      local id = ARGV[n + base + i]
      if v == id then
        free[#free + 1] = keys[j - s + 1]
      elseif v == id .. '+' then
        now_ms = now_ms or time_ms()
        name_promote(prefix, KEYS[1], ARGV[2 * n + base + i], now_ms)
      end
    end
    if #free > 0 then redis.call('DEL', unpack(free)) end
  end
end
return out
