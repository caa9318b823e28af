--[[
  Commit held keys' positions, fenced, and go on, let go when drained, or
  yield: for each key, atomically, move its committed position (trimming the
  messages up to it), then keep the key when messages remain (the caller
  reads them with a plain "XRANGE <data stream> - + COUNT n" sent right
  behind this call: every message left is after the position), or (when
  there are none) release it: the lock, the LBS entry and every key of the
  key are gone, and a message published after this call registers it
  again.

  KEYS[1]  the load-balancer stream, <service>-input

  ARGV[1]  the service's key prefix, "{<service>-input}:" (data stream
           "<prefix>k:<key>", state "<prefix>m:<key>", in KEYS[1]'s slot)
  ARGV[2]  the lock key prefix, "lock:{<service>-input}:"
  ARGV[3]  consumer group
  ARGV[4]  "1" to use XACKDEL (Redis >= 8.2), "0" for XACK + XDEL
  ARGV[5]  the dead-letter stream, {<service>-input}:dlq ("": a skipped
           message is dropped)
  ARGV[6]  the managed-field prefix of dead letters (Config.field_prefix)
  then, per key (7 each):
           key, LBS entry id, our lock value ("<token>:<owner>"),
           new position: the id of the last message processed, "" for none,
           mode: "go" (carry on while messages remain), "yield" (messages
             remain: register the key again at the back of the LBS and let
             go), "retry:<ms>" (a failed batch: as "yield", but the new
             registration is parked for <ms> first, in the parking stream
             "<prefix>delayed" with its due time in "<prefix>due", which
             promote-3.lua moves back; "reg" names the parked copy, so a
             message published meanwhile does not register the key again),
             "skip" (after the position, dead-letter the next message with
             the reason and commit past it, then as "go"), "last:<n>" (as
             "go" for a holder that expects the key drained, so reads
             nothing behind this call: the next <n> messages, if any came,
             are in the reply),
           registration: the key's lbs-input value (used by "yield" and
             "retry:<ms>" only: "" will do for the others),
           reason: why a skipped message is dead-lettered, with who skipped it

  Checked for every key before the first write: the lock holds our value
  and the key's state (a hash) names our entry as its holder (else code 2
  for that key: a zombie, a disowned holder, or a state of another type;
  nothing written for it); each position is an entry id not below the
  committed one and each mode known (else "ERR lbs commit-1: ...", nothing
  written at all). A data stream of another type is found by the key's
  first read, before its first write: code 2, nothing written for it.

  A dead letter is the message's fields plus <prefix>reason,
  <prefix>failed_id (the message id), <prefix>key and <prefix>retry_count
  (the retries after its first failure: "tries" - 2, as the skipping hold
  counted itself). A commit that moves the position sets "tries" to 1 with
  "go" or "last" (this hold is the first try there) and 0 with "yield".
  Trimming is exact (XTRIM MINID): every message up to the position is
  deleted.

  Output: one reply per key, in order:
    {1}            still ours: messages remain after the position
    {1, messages}  the same for "last:<n>": the next messages (XRANGE's reply)
    {2}            not ours (lock lost, or another holder): nothing written
    {5}            released: drained; lock, entry and the key's keys deleted
    {6, id}        yielded: registered again as LBS entry <id> (or parked as
                   <id>, "retry:<ms>"); lock and old entry gone, position kept

  Events: del on the lock keys it releases.
]]
local prefix, lock_prefix, group = ARGV[1], ARGV[2], ARGV[3]
local xackdel, dlq, fp = ARGV[4] == '1', ARGV[5], ARGV[6]
local last = #ARGV
if (last - 6) % 7 ~= 0 then
  return redis.error_reply('ERR lbs commit-1: expected 6 arguments, then 7 per key')
end
local match, tonumber = string.match, tonumber
-- Every command this script may call is allowed on these keys by the ACL:
-- checked before anything is written, so a missing one refuses the call
-- whole instead of stopping it half-way.
local function refused_by_acl(name, calls)
  for _, c in ipairs(calls) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM lbs ' .. name .. ': the ACL does not allow ' .. table.concat(c, ' '))
    end
  end
end
if last >= 13 then
  local data, state, lock = prefix .. 'k:' .. ARGV[7], prefix .. 'm:' .. ARGV[7], lock_prefix .. ARGV[8]
  local calls = {{'GET', lock}, {'HMGET', state, 'holder'}, {'XRANGE', data, '-', '+'}, {'DEL', lock, state, data},
                 {'HSET', state, 'pos', 'v'}, {'XTRIM', data, 'MINID', '0'}, {'HDEL', state, 'holder'},
                 {'XADD', KEYS[1], '*', 'f', 'v'}, {'XADD', prefix .. 'delayed', '*', 'f', 'v'},
                 {'ZADD', prefix .. 'due', '0', 'm'}, {'TYPE', prefix .. 'due'}, {'TIME'}}
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
-- nothing written. Per key i: ours[i], and for ours its lock and state key
-- names, committed position ("": none) and tries.
local ours, locks, states, committed, tries, delays, lasts = {}, {}, {}, {}, {}, {}, {}
local parking_checked = false
local i = 0
for at = 7, last, 7 do
  i = i + 1
  local pos, mode = ARGV[at + 3], ARGV[at + 4]
  local pms, pseq
  if pos ~= '' then
    pms, pseq = match(pos, '^(%d+)%-(%d+)$')
    if not pms then
      return redis.error_reply('ERR lbs commit-1: position ' .. pos .. ' is not an entry id')
    end
  end
  local last = mode ~= 'go' and tonumber(match(mode, '^last:(%d+)$'))
  if last then
    lasts[i] = last
  elseif mode ~= 'go' and mode ~= 'yield' and mode ~= 'skip' then
    local delay = tonumber(match(mode, '^retry:(%d+)$'))
    if not delay then
      return redis.error_reply('ERR lbs commit-1: mode ' .. mode ..
                               ' is not go, last:<n>, yield, retry:<ms> or skip')
    end
    delays[i] = delay
    if delay > 0 and not parking_checked then
      for key, want in pairs({[prefix .. 'delayed'] = 'stream', [prefix .. 'due'] = 'zset'}) do
        local t = redis.call('TYPE', key)['ok']
        if t ~= 'none' and t ~= want then
          return redis.error_reply('LBSKEY ' .. key .. ' holds a ' .. t .. ', not a ' .. want)
        end
      end
      parking_checked = true
    end
  end
  local entry, lock = ARGV[at + 1], lock_prefix .. ARGV[at + 1]
  local mine = false
  if redis.pcall('GET', lock) == ARGV[at + 2] then
    local state = prefix .. 'm:' .. ARGV[at]
    local got = redis.pcall('HMGET', state, 'holder', 'pos', 'tries')  -- a non-hash: an error, not ours
    if not got.err and got[1] == entry then
      local c = got[2]
      if not c then
        mine, c = true, ''
      else
        local cms, cseq = match(c, '^(%d+)%-(%d+)$')
        if cms then
          mine = true
          if pms and pos ~= c then
            pms, pseq, cms, cseq = tonumber(pms), tonumber(pseq), tonumber(cms), tonumber(cseq)
            if pms < cms or (pms == cms and pseq < cseq) then
              return redis.error_reply('ERR lbs commit-1: position ' .. pos .. ' of ' .. ARGV[at] ..
                                       ' is below the committed ' .. c)
            end
          end
        end
      end
      if mine then locks[i], states[i], committed[i], tries[i] = lock, state, c, got[3] end
    end
  end
  ours[i] = mine
end

-- Pass 2: writes, key by key. A key's data stream of another type is found by
-- its first read (pcall), before anything of that key is written. The LBS
-- entries of the keys released or yielded are acknowledged and deleted
-- together at the end (one XACKDEL per 500).
local finished = {}

local function after_pos(data, pos, count)
  return redis.pcall('XRANGE', data, pos == '' and '-' or '(' .. pos, '+', 'COUNT', count)
end

local function commit(i, at)
  local key, entry, pos, mode = ARGV[at], ARGV[at + 1], ARGV[at + 3], ARGV[at + 4]
  local data, state = prefix .. 'k:' .. key, states[i]
  local position = committed[i]
  local moved = pos ~= '' and pos ~= position
  if moved then position = pos end
  local rest = after_pos(data, position, 1)
  if rest.err then return {2} end
  if mode == 'skip' then
    local head = rest[1]
    if head then
      local fields = head[2]
      for _, f in ipairs({fp .. 'reason', ARGV[at + 6], fp .. 'failed_id', head[1], fp .. 'key', key,
                          fp .. 'retry_count', tostring(math.max(0, (tonumber(tries[i]) or 2) - 2))}) do
        fields[#fields + 1] = f
      end
      if dlq ~= '' then redis.call('XADD', dlq, '*', unpack(fields)) end
      position, moved = head[1], true
      rest = after_pos(data, position, 1)
    end
    mode = 'go'
  end
  -- Every message up to the old position is trimmed: what follows the new one is what is left.
  if #rest == 0 then
    redis.call('DEL', locks[i], state, data)  -- drained: nothing of the key is left
    finished[#finished + 1] = entry
    return {5}
  end
  if moved then
    -- Going on, this hold is the first try at the new position; yielding, the next hold is.
    redis.call('HSET', state, 'pos', position, 'tries', (mode == 'go' or lasts[i]) and 1 or 0)
    local ms, seq = match(position, '^(%d+)%-(%d+)$')
    redis.call('XTRIM', data, 'MINID', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
  end
  if mode == 'go' then return {1} end
  if lasts[i] then return {1, after_pos(data, position, lasts[i])} end
  local id, delay = nil, delays[i]
  if delay and delay > 0 then
    id = redis.call('XADD', prefix .. 'delayed', '*', 'lbs-input', ARGV[at + 5], 'lbs-keyed', '1')
    local t = redis.call('TIME')
    redis.call('ZADD', prefix .. 'due', string.format('%.0f', tonumber(t[1]) * 1000
               + math.floor(tonumber(t[2]) / 1000) + delay), id)
  else
    id = redis.call('XADD', KEYS[1], '*', 'lbs-input', ARGV[at + 5], 'lbs-keyed', '1')
  end
  redis.call('HSET', state, 'reg', id)
  redis.call('HDEL', state, 'holder', 'token')
  redis.call('DEL', locks[i])
  finished[#finished + 1] = entry
  return {6, id}
end

local out = {}
i = 0
for at = 7, last, 7 do
  i = i + 1
  out[i] = ours[i] and commit(i, at) or {2}
end

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
