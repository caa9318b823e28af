--[[
  Bring parked retries back: every parked copy whose due time has come goes
  into the load-balancer stream as a fresh entry, atomically with its
  removal from the parking stream and the due index. Any number of clients
  call it; each copy comes back exactly once. A delayed publish (below)
  is published instead, as publish-1.lua publishes, when due.

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
  ARGV[3]  the service's key prefix, {<service>-input}: (same slot): names'
           holders and waiting lists (_names.lua), and the keys a delayed
           publish writes, as publish-1.lua's ARGV[1] (a key's data stream
           and state, "<prefix>idfloor", the wake channels)

  A delayed publish (lbs.Publisher's delay= or at=: one parked entry per
  call and shard) is a parked entry whose fields are:
           "lbs-publish", m (the message count, >= 1), then per message, in
           order: key, registration, field count f (even, >= 2), f fields
           (publish-1.lua's ARGV[3...]), and one "" more when m is odd (a
           stream entry holds name-value pairs)
  When due, its messages are appended to their keys' data streams and each
  key nobody holds or has queued is registered, with wakes, exactly as one
  publish-1.lua call with those messages would (_publish.lua), atomically
  with its removal from KEYS[2] and KEYS[1]: a key's messages are ordered by
  when they were appended, so a delayed message comes after those published
  before it was due. One that does not read as above (hand-made) is stuck.

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
      load-balancer stream");
    * for each delayed publish due (every due entry is read first): each
      of its keys' data streams does not exist or is a stream ("a data
      stream"), each state is a hash ("a key state"), and, when a data
      stream is created, "<prefix>idfloor" does not exist or is a sorted
      set ("a sorted set"); the ACL allows every command publishing calls
      (else "NOPERM lbs promote-4: the ACL does not allow ...").
  A malformed ARGV[1] gives "ERR lbs promote-4: ..." (nothing written).

  Order: the due ids, at most ARGV[1] (score <= TIME in ms), are handled by
  due time, then by id as numbers (a sorted set orders one score's ids as
  strings: "5-10" before "5-9"). When more than ARGV[1] are due and the
  last due time read goes on past them, its ids are left for the next
  call (when all have that due time: those of its last millisecond read),
  so two parked for the same due time come out in the order they were
  parked, unless more than ARGV[1] were parked in one millisecond for it.

  For each id due, in that order:
    * the parked entry exists: XADD its fields (the copy requeue-6.lua made:
      the entry's fields, retry count, original id) to KEYS[3], XDEL it
      from KEYS[2], ZREM it from KEYS[1];
    * it is gone (deleted by hand, or not a stream id): ZREM it;
    * a delayed publish: published (above), XDEL it from KEYS[2], ZREM it
      from KEYS[1];
    * it has more than 7,000 values, or is a delayed publish that is
      malformed or has a message of more than 7,000 field values (only a
      hand-made entry can; Lua's unpack cannot pass it): left parked,
      rescored to +inf (never due), so it neither blocks the others nor is
      lost.
  Each id is handled whole before the next, so a call that fails part-way
  leaves every copy either moved or parked.

  Output: {moved, vanished, next, stuck, names}
    moved     copies put back into KEYS[3], delayed publishes published
    vanished  ids removed from KEYS[1] whose parked entry was gone
    next      ms until the next copy is due; 0 when more than ARGV[1]
              copies were due (call again now); -1 when nothing more is
              parked
    stuck     copies too wide to move, rescored to +inf
    names     waiting registrations put back by the sweep

  Events: xadd on KEYS[3]; xdel on KEYS[2]; zrem (or zadd) on KEYS[1]; the
  sweep's as in done-n.lua; a delayed publish's as in publish-1.lua.
]]
--#include _acl
--#include _checks
--#include _names
--#include _time
--#include _publish
local MAX_COPY = 7000

-- A delayed publish's messages ({key, registration, first, last}: fields[first..last] its
-- fields; the registration of a key's first message), false for one malformed, nil for another
-- entry.
local function delayed_publish(fields)
  if fields[1] ~= 'lbs-publish' then return nil end
  local m = tonumber(fields[2])
  if not m or m < 1 or m ~= math.floor(m) then return false end
  local msgs, regs, at = {}, {}, 3
  for i = 1, m do
    local key, reg, f = fields[at], fields[at + 1], tonumber(fields[at + 2])
    if not reg or not f or f < 2 or f % 2 ~= 0 or f > MAX_COPY or at + 2 + f > #fields then
      return false
    end
    if not regs[key] then
      if reg == '' then return false end
      regs[key] = reg
    end
    msgs[i] = {key, regs[key], at + 3, at + 2 + f}
    at = at + 3 + f
  end
  if #fields - at > 0 or (#fields - at == 0 and fields[at] ~= '') then return false end
  return msgs
end

-- Due ids in the order they are moved (see Order): {id, score, ms, seq}.
local function by_due(a, b)
  if a[2] ~= b[2] then return a[2] < b[2] end
  if a[3] ~= b[3] then return a[3] < b[3] end
  if a[4] ~= b[4] then return a[4] < b[4] end
  return a[1] < b[1]
end

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
local prefix = ARGV[3]

-- What is due, read and checked before the sweep's first write.
local rows, full, found, published = {}, false, {}, {}
if parked then
  -- One more than the batch: whether the batch ends inside a due time (or millisecond).
  local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, batch + 1, 'WITHSCORES')
  for i = 1, #due, 2 do
    local ms, seq = string.match(due[i], '^(%d+)%-(%d+)$')
    rows[#rows + 1] = {due[i], tonumber(due[i + 1]) or -math.huge, tonumber(ms) or -1, tonumber(seq) or -1}
  end
  full = #rows > batch
  if full then
    local after = table.remove(rows)
    local last, same = rows[#rows], nil
    if after[2] ~= last[2] then
      same = nil  -- the batch ends with a due time
    elseif rows[1][2] ~= last[2] then
      same = 2  -- the last due time read goes on past the batch
    elseif after[3] == last[3] and rows[1][3] ~= last[3] then
      same = 3  -- one due time: its last millisecond read goes on past the batch
    end
    if same then
      while rows[#rows][same] == last[same] do rows[#rows] = nil end
    end
  end
  table.sort(rows, by_due)
  if #rows > 0 then
    bad = misfit(KEYS[2], 'stream', 'a stream') or misfit(KEYS[3], 'stream', 'the load-balancer stream')
    if bad then return redis.error_reply(bad) end
  end
  local looked, create = {}, false
  for i, row in ipairs(rows) do
    local entry = redis.pcall('XRANGE', KEYS[2], row[1], row[1])
    found[i] = entry
    local msgs = nil
    if not entry.err and #entry > 0 then msgs = delayed_publish(entry[1][2]) end
    published[i] = msgs
    if msgs then
      for _, msg in ipairs(msgs) do
        local key = msg[1]
        if not looked[key] then
          if not next(looked) then
            local data, state = prefix .. 'k:' .. key, prefix .. 'm:' .. key
            local err = refused_by_acl('promote-4', {
              {'TYPE', data}, {'TYPE', state}, {'XADD', data, '*', 'f', 'v'}, {'HMGET', state, 'reg'},
              {'XRANGE', KEYS[3], '-', '+'}, {'XADD', KEYS[3], '*', 'f', 'v'}, {'HSET', state, 'reg', 'v'},
              {'ZSCORE', prefix .. 'idfloor', 'ms'}, {'SPUBLISH', prefix .. 'wake:x', 'k'}})
            if err then return err end
          end
          looked[key] = true
          local created
          bad, created = publish_look(prefix, key)
          if bad then return redis.error_reply(bad) end
          create = create or created
        end
      end
    end
  end
  if create then
    bad = misfit(prefix .. 'idfloor', 'zset', 'a sorted set')
    if bad then return redis.error_reply(bad) end
  end
end

-- The waiting sweep: names whose holder vanished without releasing them.
local names = 0
if waiting then
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

-- One delayed publish: its messages appended in order, then its keys registered (publish-1.lua).
local wakes = {}
local function publish(fields, msgs)
  local order, states, regs, first = {}, {}, {}, nil
  for _, msg in ipairs(msgs) do
    local key = msg[1]
    local id = '*'
    if not states[key] then
      local _, created, state = publish_look(prefix, key)  -- checked above
      order[#order + 1], states[key], regs[key] = key, state, msg[2]
      if created then
        if not first then _, first = publish_first(prefix) end
        id = first
      end
    end
    redis.call('XADD', prefix .. 'k:' .. key, id, unpack(fields, msg[3], msg[4]))
  end
  for _, key in ipairs(order) do
    publish_register(KEYS[3], prefix, key, regs[key], states[key], wakes)
  end
end

local moved, vanished, stuck = 0, 0, 0
for i, row in ipairs(rows) do
  local id, entry = row[1], found[i]
  if entry.err or #entry == 0 then
    redis.call('ZREM', KEYS[1], id)
    vanished = vanished + 1
  elseif published[i] == false or (published[i] == nil and #entry[1][2] > MAX_COPY) then
    redis.call('ZADD', KEYS[1], '+inf', id)
    stuck = stuck + 1
  else
    if published[i] then
      publish(entry[1][2], published[i])
    else
      redis.call('XADD', KEYS[3], '*', unpack(entry[1][2]))
    end
    redis.call('XDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    moved = moved + 1
  end
end
publish_wake(prefix, wakes)

local next = -1
if full then
  next = 0
else
  local first = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if #first > 0 and tonumber(first[2]) < math.huge then
    next = tonumber(first[2]) - tonumber(now)
  end
end
return {moved, vanished, next, stuck, names}
