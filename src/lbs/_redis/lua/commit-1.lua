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
             the reason and commit past it, then as "go"),
           registration: the key's lbs-input value (used by "yield"),
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
  "go" (this hold is the first try there) and 0 with "yield". Trimming is exact (XTRIM MINID): every
  message up to the position is deleted.

  Output: one reply per key, in order:
    {1}            still ours: messages remain after the position
    {2}            not ours (lock lost, or another holder): nothing written
    {5}            released: drained; lock, entry and the key's keys deleted
    {6, id}        yielded: registered again as LBS entry <id> (or parked as
                   <id>, "retry:<ms>"); lock and old entry gone, position kept

  Events: del on the lock keys it releases.
]]
local prefix, lock_prefix, group = ARGV[1], ARGV[2], ARGV[3]
local xackdel, dlq, fp = ARGV[4] == '1', ARGV[5], ARGV[6]
if (#ARGV - 6) % 7 ~= 0 then
  return redis.error_reply('ERR lbs commit-1: expected 6 arguments, then 7 per key')
end

local function split(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function below(a, b)  -- entry id a < b
  local am, as = split(a)
  local bm, bs = split(b)
  return am < bm or (am == bm and as < bs)
end
local function after(id)  -- the smallest id above id
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end
local function finish(entry)
  if xackdel then
    redis.pcall('XACKDEL', KEYS[1], group, 'IDS', 1, entry)
  elseif redis.pcall('XACK', KEYS[1], group, entry) == 1 then
    redis.pcall('XDEL', KEYS[1], entry)
  end
end

-- Pass 1, reads only: check every argument and each key's hold; a bad
-- argument (or a parking key of the wrong type) fails the call with
-- nothing written.
local keys, parking_checked = {}, false
for at = 7, #ARGV, 7 do
  local k = {key = ARGV[at], entry = ARGV[at + 1], pos = ARGV[at + 3], mode = ARGV[at + 4],
             registration = ARGV[at + 5], reason = ARGV[at + 6]}
  if k.pos ~= '' and not split(k.pos) then
    return redis.error_reply('ERR lbs commit-1: position ' .. k.pos .. ' is not an entry id')
  end
  k.delay = tonumber(string.match(k.mode, '^retry:(%d+)$'))
  if k.delay then k.mode = 'yield' end
  if k.mode ~= 'go' and k.mode ~= 'yield' and k.mode ~= 'skip' then
    return redis.error_reply('ERR lbs commit-1: mode ' .. k.mode .. ' is not go, yield, retry:<ms> or skip')
  end
  if k.delay and k.delay > 0 and not parking_checked then
    for key, want in pairs({[prefix .. 'delayed'] = 'stream', [prefix .. 'due'] = 'zset'}) do
      local t = redis.call('TYPE', key)['ok']
      if t ~= 'none' and t ~= want then
        return redis.error_reply('LBSKEY ' .. key .. ' holds a ' .. t .. ', not a ' .. want)
      end
    end
    parking_checked = true
  end
  k.data, k.state, k.lock = prefix .. 'k:' .. k.key, prefix .. 'm:' .. k.key, lock_prefix .. k.entry
  local holder
  if redis.pcall('GET', k.lock) == ARGV[at + 2] then
    local got = redis.pcall('HMGET', k.state, 'holder', 'pos', 'tries')  -- a non-hash: an error, not ours
    if not got.err then holder, k.committed, k.tries = got[1], got[2], got[3] end
  end
  k.ours = holder == k.entry and (not k.committed or split(k.committed) ~= nil)
  if k.ours and k.pos ~= '' and k.committed and below(k.pos, k.committed) then
    return redis.error_reply('ERR lbs commit-1: position ' .. k.pos .. ' of ' .. k.key ..
                             ' is below the committed ' .. k.committed)
  end
  keys[#keys + 1] = k
end

-- Pass 2: writes, key by key. A key's data stream of another type is found by
-- its first read (pcall), before anything of that key is written.
local function after_pos(k, committed, count)
  return redis.pcall('XRANGE', k.data, committed == '' and '-' or '(' .. committed, '+', 'COUNT', count)
end

local function commit(k)
  local committed, mode = k.committed or '', k.mode
  local moved = k.pos ~= '' and k.pos ~= committed
  if moved then committed = k.pos end
  local rest = after_pos(k, committed, 1)
  if rest.err then return {2} end
  if mode == 'skip' then
    local head = rest[1]
    if head then
      local fields = head[2]
      for _, f in ipairs({fp .. 'reason', k.reason, fp .. 'failed_id', head[1], fp .. 'key', k.key,
                          fp .. 'retry_count', tostring(math.max(0, (tonumber(k.tries) or 2) - 2))}) do
        fields[#fields + 1] = f
      end
      if dlq ~= '' then redis.call('XADD', dlq, '*', unpack(fields)) end
      committed, moved = head[1], true
      rest = after_pos(k, committed, 1)
    end
    mode = 'go'
  end
  -- Every message up to the old position is trimmed: what follows the new one is what is left.
  if #rest == 0 then
    redis.call('DEL', k.lock, k.state, k.data)  -- drained: nothing of the key is left
    finish(k.entry)
    return {5}
  end
  if moved then
    -- Going on, this hold is the first try at the new position; yielding, the next hold is.
    redis.call('HSET', k.state, 'pos', committed, 'tries', mode == 'go' and 1 or 0)
    redis.call('XTRIM', k.data, 'MINID', after(committed))
  end
  if mode == 'go' then return {1} end
  local id
  if k.delay and k.delay > 0 then
    id = redis.call('XADD', prefix .. 'delayed', '*', 'lbs-input', k.registration, 'lbs-keyed', '1')
    local t = redis.call('TIME')
    redis.call('ZADD', prefix .. 'due', string.format('%.0f', tonumber(t[1]) * 1000
               + math.floor(tonumber(t[2]) / 1000) + k.delay), id)
  else
    id = redis.call('XADD', KEYS[1], '*', 'lbs-input', k.registration, 'lbs-keyed', '1')
  end
  redis.call('HSET', k.state, 'reg', id)
  redis.call('HDEL', k.state, 'holder', 'token')
  redis.call('DEL', k.lock)
  finish(k.entry)
  return {6, id}
end

local out = {}
for i, k in ipairs(keys) do
  out[i] = k.ours and commit(k) or {2}
end
return out
