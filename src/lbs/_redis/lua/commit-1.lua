--[[
  Commit held keys' positions, fenced, with their batches' effects, and go
  on, let go when drained, yield, or count a failure: for each key,
  atomically, write the effects its handler emitted and move its committed
  position (trimming the messages up to it), then keep the key when
  messages remain (the caller reads them with a plain "XRANGE <data
  stream> - + COUNT n" sent right behind this call: every message left is
  after the position), or (when there are none) release it: the LBS entry
  and every key of the key are gone, and a message published
  after this call registers it again.

  KEYS[1]  the load-balancer stream, <service>-input

  ARGV[1]  the service's key prefix, "{<service>-input}:" (data stream
           "<prefix>k:<key>", state "<prefix>m:<key>", in KEYS[1]'s slot)
  ARGV[2]  the lease key prefix, "{<service>-input}:lease:"
  ARGV[3]  consumer group
  ARGV[4]  "1" to use XACKDEL (Redis >= 8.2), "0" for XACK + XDEL
  ARGV[5]  the dead-letter stream, {<service>-input}:dlq ("": a message
           dead-lettered is dropped)
  ARGV[6]  the managed-field prefix of dead letters (Config.field_prefix)
  ARGV[7]  max retries: a message is dead-lettered once it has failed in
           1 + this many holds ("-1": never)
  ARGV[8]  our consumer name, recorded in dead letters
  then, per key (9 + its effects):
           key, LBS entry id, our hold ("<token>:<consumer id>:<instance
             nonce>": ours while that consumer's lease holds the nonce),
           new position: the id of the last message processed, "" for none,
           mode: "go" (carry on while messages remain), "yield" (messages
             remain: register the key again at the back of the LBS and let
             go), "skip" (after the position, dead-letter the next message
             with the reason and commit past it, then as "go"), "last:<n>"
             (as "go" for a holder that expects the key drained, so reads
             nothing behind this call: the next <n> messages, if any came,
             are in the reply), "stay:<n>" (as "last:<n>", but a key
             found drained stays ours, running nothing: "idle:<token>" and
             "lingers" are set in its state, see fetch-1.lua, and
             publish-1.lua wakes us when a message comes), "fail:<ms>:<blame>:<last>:<n>" (the hold's
             batch failed after the position; <last> is its last message;
             <blame> "1" when it held one message, which is then the
             culprit, "0" for several: see Failures; a "fail" whose batch
             is behind the position already, sent again after its reply
             was lost, counts nothing and goes on as "last:<n>"),
           registration: the key's lbs-input value (used when the key is
             registered again: "yield", "fail"; "" will do for the others),
           reason: why a message is dead-lettered ("skip": all of it;
             "fail": what failed, after "failed in <n> holds; "),
           traceback: recorded with a dead letter ("" for none),
           effect count e, then e effects: stream, field count f (even,
             >= 2), f fields

  Effects are written with the commit that moves the position past their
  batch, in this call: a holder that lost the key writes none, and a call
  sent again after its reply was lost (the position already moved) writes
  none twice. Each is a plain "XADD <stream> * <fields>".

  Failures. The key's state counts, for the message right after the
  position (the head), "fails": the failed holds blamed on it; and while a
  failed batch is being taken apart, "until" (the batch's last message)
  and "unblamed" ("1": that batch's failure is not blamed on a message
  yet). A failed batch of several messages sets "until" and "unblamed";
  the holds after it give the handler one message at a time until the
  position passes "until" (the client reads "until" and "fails" in the
  replies). A failed hold of one message adds 1 (+ "unblamed", which goes
  to 0) to the head's "fails"; once "fails" reaches 1 + ARGV[7] the head is
  dead-lettered (reason "failed in <fails> holds; <reason>") and the key
  goes on as "last:<n>"; otherwise the registration is parked for <ms> in
  "<prefix>delayed" (due time in "<prefix>due", which promote-4.lua moves
  back; "reg" names the parked copy, so a message published meanwhile does
  not register the key again), or put at the back of the LBS for 0. A
  position that moves sets "fails" to 0.

  Checked for every key before the first write: our lease holds our nonce
  and the key's state (a hash) names our entry as its holder (else code 2
  for that key: a zombie, a disowned holder, or a state of another type;
  nothing written for it); each effect's stream is a stream (or absent)
  the ACL lets us XADD to (else code 7: nothing written for the key, which
  stays ours); each position is an entry id not below the committed one and
  each mode known (else "ERR lbs commit-1: ...", nothing written at all);
  the parking keys, when a step parks, are of their type (else "LBSKEY <key>
  holds a <type>, not a <type>", nothing written at all). A data stream of
  another type is found by the key's first read, before its first write:
  code 2, nothing written for it. A "<prefix>idfloor" of another type is
  left alone (publish-1.lua refuses to start a data stream until it is
  fixed, so no id can repeat meanwhile).

  A dead letter is the message's fields plus <prefix>reason,
  <prefix>failed_id (the message id), <prefix>key, <prefix>retry_count
  (its failed holds after the first), <prefix>consumer (ARGV[8]) and, when
  given, <prefix>traceback. A commit that moves the position sets "tries"
  (holds that started at the position, counted by fetch-1.lua) to 1 with
  "go", "last", "stay" or "skip" (this hold is the first try there) and 0
  when the key is registered again. Every step of a key that stays ours
  deletes the hold's "idle:<token>" and "lingers", except a "stay" that
  finds the key drained, which sets them; registering again deletes them
  and "who" with "holder". Trimming is exact (XTRIM MINID): every message up to the
  position is deleted. A drained key's data stream is deleted;
  the milliseconds of its last id (the position) go into the sorted set
  "<prefix>idfloor" (member "ms", ZADD GT: the highest so far), and
  publish-1.lua starts a new data stream after that millisecond, so a key's
  ids only grow.

  Output: one reply per key, in order:
    {1, fails, unblamed, until}            still ours: messages remain
    {1, fails, unblamed, until, messages}  the same for "last:<n>",
                                           "stay:<n>" (messages empty: the
                                           key stays, drained) and a
                                           "fail" that dead-lettered: the
                                           next messages (XRANGE's reply)
    {2}            not ours (lease lost, or another holder): nothing written
    {5}            released: drained; entry and the key's keys deleted
    {6, id}        registered again as LBS entry <id> (or parked as <id>);
                   old entry gone, position kept
    {7, why}       an effect cannot be written: nothing written, still ours
  ("until" is "" when no failed batch is being taken apart.)

  Events: del on the keys of the keys it releases.
]]
--#include _acl
--#include _checks
--#include _keyed
--#include _time
local prefix, leases, group = ARGV[1], ARGV[2], ARGV[3]
local xackdel, dlq, fp = ARGV[4] == '1', ARGV[5], ARGV[6]
local max_retries, consumer = tonumber(ARGV[7]), ARGV[8]
local match, tonumber, tostring = string.match, tonumber, tostring
if not max_retries or max_retries < -1 or max_retries ~= math.floor(max_retries) then
  return redis.error_reply('ERR lbs commit-1: max retries (ARGV[7]) must be an integer >= -1')
end
local floor_key = prefix .. 'idfloor'

-- The ACL allows every command this script may call on these keys (checked before any write).
if #ARGV >= 17 then
  local data, state, lease = prefix .. 'k:' .. ARGV[9], prefix .. 'm:' .. ARGV[9], leases .. 'x'
  local calls = {{'GET', lease}, {'HMGET', state, 'holder'}, {'XRANGE', data, '-', '+'}, {'DEL', state, data},
                 {'HSET', state, 'pos', 'v'}, {'XTRIM', data, 'MINID', '0'}, {'HDEL', state, 'holder'},
                 {'XADD', KEYS[1], '*', 'f', 'v'}, {'XADD', prefix .. 'delayed', '*', 'f', 'v'},
                 {'ZADD', prefix .. 'due', '0', 'm'}, {'TYPE', prefix .. 'due'}, {'TIME'},
                 {'ZADD', floor_key, 'GT', '0', 'ms'}, {'HDEL', state, 'f'}}
  if dlq ~= '' then calls[#calls + 1] = {'XADD', dlq, '*', 'f', 'v'} end
  if xackdel then
    calls[#calls + 1] = {'XACKDEL', KEYS[1], group, 'IDS', '1', '0-1'}
  else
    calls[#calls + 1] = {'XACK', KEYS[1], group, '0-1'}
    calls[#calls + 1] = {'XDEL', KEYS[1], '0-1'}
  end
  local err = refused_by_acl('commit-1', calls)
  if err then return err end
end

-- Pass 1, reads only: check every argument and each key's hold; a bad
-- argument (or a parking key of the wrong type) fails the call with
-- nothing written. Per key i: where its arguments start, ours[i] (or a
-- refusal), and for ours its state key name and state.
local starts, ours, refusals, states, st, fails_of, lasts, effects = {}, {}, {}, {}, {}, {}, {}, {}
local stays = {}
local parking_checked = false
local streams_checked = {}
local NONE = {}
local last = #ARGV

local at, i = 9, 0
while at <= last do
  i = i + 1
  starts[i] = at
  if at + 8 > last then
    return redis.error_reply('ERR lbs commit-1: key ' .. i .. ' has fewer than 9 arguments')
  end
  local pos, mode = ARGV[at + 3], ARGV[at + 4]
  if pos ~= '' and not split_id(pos) then
    return redis.error_reply('ERR lbs commit-1: position ' .. pos .. ' is not an entry id')
  end
  local n_last = mode ~= 'go' and tonumber(match(mode, '^last:(%d+)$'))
  local n_stay = not n_last and mode ~= 'go' and tonumber(match(mode, '^stay:(%d+)$'))
  local delay
  if n_last then
    lasts[i] = n_last
  elseif n_stay then
    lasts[i], stays[i] = n_stay, true
  elseif mode ~= 'go' and mode ~= 'yield' and mode ~= 'skip' then
    local ms, blame, fl, n = match(mode, '^fail:(%d+):([01]):(%d+%-%d+):(%d+)$')
    if not ms then
      return redis.error_reply('ERR lbs commit-1: mode ' .. mode ..
                               ' is not go, last:<n>, stay:<n>, yield, skip or fail:<ms>:<blame>:<last>:<n>')
    end
    delay = tonumber(ms)
    fails_of[i] = {delay = delay, blame = blame == '1', last = fl, n = tonumber(n)}
  end
  if delay and delay > 0 and not parking_checked then
    for key, want in pairs({[prefix .. 'delayed'] = 'stream', [prefix .. 'due'] = 'zset'}) do
      local bad = misfit(key, want, 'a ' .. want)
      if bad then return redis.error_reply(bad) end
    end
    parking_checked = true
  end
  local e = tonumber(ARGV[at + 8])
  if not e or e < 0 or e ~= math.floor(e) then
    return redis.error_reply('ERR lbs commit-1: the effect count of key ' .. ARGV[at] .. ' is not an integer >= 0')
  end
  local list = e > 0 and {} or NONE
  local next_at = at + 9
  for k = 1, e do
    local f = tonumber(ARGV[next_at + 1])
    if not f or f < 2 or f % 2 ~= 0 or next_at + 1 + f > last then
      return redis.error_reply('ERR lbs commit-1: effect ' .. k .. ' of key ' .. ARGV[at] .. ' is malformed')
    end
    list[k] = {ARGV[next_at], next_at + 2, next_at + 1 + f}
    next_at = next_at + 2 + f
  end
  effects[i] = list

  local entry, state = ARGV[at + 1], prefix .. 'm:' .. ARGV[at]
  local mine = false
  -- A state of another type than hash (an error reply): not ours.
  -- The hold's "idle:<token>" too: a step that keeps the key deletes it only where it is.
  local got = keyed_state(leases, ARGV[at + 2], state, 'idle:' .. (match(ARGV[at + 2], '^(%d+):') or ''))
  if got and not got.err and got[1] == entry then
    local c = got[2] or ''
    if c == '' or split_id(c) then
      mine = true
      if pos ~= '' and c ~= '' and pos ~= c and id_below(pos, c) then
        return redis.error_reply('ERR lbs commit-1: position ' .. pos .. ' of ' .. ARGV[at] ..
                                 ' is below the committed ' .. c)
      end
      states[i] = state
      st[i] = got  -- holder, pos, tries, fails, unblamed, until, token
    end
  end
  ours[i] = mine
  if mine then
    for _, eff in ipairs(list) do
      local stream = eff[1]
      local why = streams_checked[stream]
      if why == nil then
        local t = redis.call('TYPE', stream)['ok']
        if t ~= 'none' and t ~= 'stream' then
          why = stream .. ' holds a ' .. t .. ', not a stream'
        elseif not redis.acl_check_cmd('XADD', stream, '*', 'f', 'v') then
          why = 'the ACL does not allow XADD to ' .. stream
        else
          why = false
        end
        streams_checked[stream] = why
      end
      if why then
        refusals[i] = {7, 'an effect cannot be written: ' .. why}
        break
      end
    end
  end
  at = next_at
end

-- Pass 2: writes, key by key. A key's data stream of another type is found by
-- its first read (pcall), before anything of that key is written. The LBS
-- entries of the keys released or yielded are acknowledged and deleted
-- together at the end (one XACKDEL per 500).
local finished = {}
-- The highest milliseconds of the positions of the keys this call drains (-1: none).
local highest = -1
local find, sub = string.find, string.sub

local function dead_letter(head, key, reason, traceback, retries)
  local fields = head[2]
  for _, f in ipairs({fp .. 'reason', reason, fp .. 'failed_id', head[1], fp .. 'key', key,
                      fp .. 'retry_count', tostring(math.max(0, retries)), fp .. 'consumer', consumer}) do
    fields[#fields + 1] = f
  end
  if traceback ~= '' then
    fields[#fields + 1] = fp .. 'traceback'
    fields[#fields + 1] = traceback
  end
  if dlq ~= '' then redis.call('XADD', dlq, '*', unpack(fields)) end
end

-- Drained: nothing of the key is left.
local function release(i, position, data, state, entry)
  -- Every message up to the position is trimmed: the position is the data stream's last id.
  if position ~= '' then
    local ms = tonumber(sub(position, 1, find(position, '-', 1, true) - 1))
    if ms > highest then highest = ms end
  end
  redis.call('DEL', state, data)
  finished[#finished + 1] = entry
  return {5}
end

local function commit(i)
  local at = starts[i]
  local key, entry, pos, mode = ARGV[at], ARGV[at + 1], ARGV[at + 3], ARGV[at + 4]
  local data, state, got = prefix .. 'k:' .. key, states[i], st[i]
  local position = got[2] or ''
  local moved = pos ~= '' and pos ~= position
  if moved then position = pos end
  -- What follows the position; for "last"/"stay" as many as the reply carries (read once).
  local read_n = lasts[i] or 1
  local rest = keyed_after(data, position, read_n)
  if rest.err then return {2} end
  local rest_at = position
  -- The batch's effects, with the commit that moves the position past it.
  if moved then
    for _, eff in ipairs(effects[i]) do
      redis.call('XADD', eff[1], '*', unpack(ARGV, eff[2], eff[3]))
    end
  end
  local fail = fails_of[i]
  local idle = 'idle:' .. (match(ARGV[at + 2], '^(%d+):') or '')
  local was_idle = got[8]
  local staying = stays[i] and #rest == 0
  if #rest == 0 and not fail and mode ~= 'skip' and not staying then
    return release(i, position, data, state, entry)
  end
  -- The state as read, and as this step leaves it.
  local was_fails, was_unblamed = tonumber(got[4]) or 0, tonumber(got[5]) or 0
  local was_until = got[6] and split_id(got[6]) and got[6] or ''
  local fails, unblamed, untl = was_fails, was_unblamed, was_until
  if moved then fails = 0 end
  -- What the key does next: "go", "last" (with count: read the next messages here), "yield", "park".
  local going, count = mode, lasts[i]
  if count then going = 'last' end
  if fail and (not rest[1] or id_below(fail.last, rest[1][1])) then
    -- The failed batch is behind the position already: this call was sent again after its
    -- reply was lost, and the first one counted the failure. Go on.
    fail, going, count = nil, 'last', fail.n
  end
  if mode == 'skip' or (fail and fail.blame) then
    if fail then
      fails = fails + 1 + unblamed
      unblamed = 0
    end
    if mode == 'skip' or (max_retries >= 0 and fails >= 1 + max_retries) then
      local head = rest[1]
      if head then
        local reason = ARGV[at + 6]
        if fail then reason = 'failed in ' .. fails .. ' holds; ' .. reason end
        dead_letter(head, key, reason, ARGV[at + 7], fails - 1)
        position, moved, fails = head[1], true, 0
        rest = keyed_after(data, position, 1)
      end
      if fail then going, count = 'last', fail.n else going = 'go' end
    else
      going = 'park'
    end
  elseif fail then
    -- A batch of several failed: take it apart, one message a hold, up to its last.
    if untl == '' or id_below(untl, fail.last) then untl = fail.last end
    unblamed = 1
    going = 'park'
  end
  if untl ~= '' and (position ~= '' and not id_below(position, untl)) then untl, unblamed = '', 0 end
  -- Every message up to the old position is trimmed: what follows the new one is what is left.
  if #rest == 0 and not staying then return release(i, position, data, state, entry) end
  local registers = going == 'yield' or going == 'park'
  local set = {}
  if moved then
    -- Going on, this hold is the first try at the new position; registering again, the next hold is.
    set[#set + 1], set[#set + 2] = 'pos', position
    set[#set + 1], set[#set + 2] = 'tries', registers and 0 or 1
  end
  local del = {}
  if fails ~= 0 then
    set[#set + 1], set[#set + 2] = 'fails', fails
  elseif was_fails ~= 0 then
    del[#del + 1] = 'fails'
  end
  if unblamed ~= 0 then
    set[#set + 1], set[#set + 2] = 'unblamed', unblamed
  elseif was_unblamed ~= 0 then
    del[#del + 1] = 'unblamed'
  end
  if untl ~= '' then
    if untl ~= was_until then set[#set + 1], set[#set + 2] = 'until', untl end
  elseif was_until ~= '' then
    del[#del + 1] = 'until'
  end
  if moved then
    local ms, seq = split_id(position)
    redis.call('XTRIM', data, 'MINID', string.format('%d-%d', ms, seq + 1))
  end
  if registers then
    local id
    local delay = going == 'park' and fail.delay or 0
    if delay > 0 then
      id = redis.call('XADD', prefix .. 'delayed', '*', 'lbs-input', ARGV[at + 5], 'lbs-keyed', '1')
      redis.call('ZADD', prefix .. 'due', string.format('%.0f', time_ms() + delay), id)
    else
      id = redis.call('XADD', KEYS[1], '*', 'lbs-input', ARGV[at + 5], 'lbs-keyed', '1')
    end
    set[#set + 1], set[#set + 2] = 'reg', id
    for _, f in ipairs({'holder', 'token', 'who', idle, 'lingers'}) do del[#del + 1] = f end
    redis.call('HSET', state, unpack(set))
    redis.call('HDEL', state, unpack(del))
    finished[#finished + 1] = entry
    return {6, id}
  end
  if staying then
    if not was_idle then
      set[#set + 1], set[#set + 2] = idle, '1'
      set[#set + 1], set[#set + 2] = 'lingers', '1'
    end
  elseif was_idle then
    del[#del + 1], del[#del + 2] = idle, 'lingers'
  end
  if #set > 0 then redis.call('HSET', state, unpack(set)) end
  if #del > 0 then redis.call('HDEL', state, unpack(del)) end
  if going == 'last' then
    if rest_at ~= position or read_n < count then rest = keyed_after(data, position, count) end
    return {1, fails, unblamed, untl, rest}
  end
  return {1, fails, unblamed, untl}
end

local out = {}
for k = 1, i do
  if not ours[k] then
    out[k] = {2}
  elseif refusals[k] then
    out[k] = refusals[k]
  else
    out[k] = commit(k)
  end
end

-- One floor for the whole call (pcall: a floor of another type is left alone, see above).
if highest >= 0 then redis.pcall('ZADD', floor_key, 'GT', highest, 'ms') end

-- pcall: a group or LBS gone meanwhile leaves nothing to acknowledge.
for from = 1, #finished, 500 do
  local part = {unpack(finished, from, math.min(from + 499, #finished))}
  if xackdel then
    redis.pcall('XACKDEL', KEYS[1], group, 'IDS', #part, unpack(part))
  else
    local acked = {}
    for _, id in ipairs(part) do
      if redis.pcall('XACK', KEYS[1], group, id) == 1 then acked[#acked + 1] = id end
    end
    if #acked > 0 then redis.pcall('XDEL', KEYS[1], unpack(acked)) end
  end
end
return out
