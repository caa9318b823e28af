--[[
  Read a batch of assignments for one consumer under its lease: an entry
  pending to a consumer in the group is held while that consumer's lease
  (KEYS[3]) lives with the value it was read under, so delivery needs no
  lock per entry. Each entry gets a fencing token from the service's
  counter; one whose DataStreamName another pending entry holds waits.

  KEYS[1]  the load-balancer stream, <service>-input
  KEYS[2]  the service's fencing counter, {<service>-input}:fence: a plain
           decimal integer. When it does not exist (a restart without
           persistence, an eviction) or is below the server time in
           microseconds (TIME: sec * 1000000 + usec; a failover to a replica
           that missed the last tokens) it is set to that time first, so
           tokens never go backwards (_fence.lua).
  KEYS[3]  this consumer's lease, {<service>-input}:lease:<consumer id>: a
           string holding ARGV[4] while this process holds its lease

  ARGV[1]  consumer group
  ARGV[2]  consumer id: the consumer name in the group
  ARGV[3]  most entries to read (COUNT), an integer >= 1 (at most 15 digits)
  ARGV[4]  the lease's value (the nonce, "<nonce>.<n>" at its n-th take): nothing is read
           unless KEYS[3] holds it (a lapsed lease holds nothing: entries
           delivered now would be held by nobody)
  ARGV[5]  ">" for new entries; "0" to re-read this consumer's own pending
           entries (after a read whose reply was lost): listed with XPENDING
           and read with XRANGE, not XREADGROUP's history, which would count
           one more delivery of each (and a delivery beyond the first is a
           holder's death to requeue-6.lua: a retry nobody caused)
  ARGV[6]  optional: the reading consumer's queued set, {<service>-input}:
           queued:<consumer id>, when the reader queues what it takes
           instead of starting a handler at once (the notification API):
           every new entry it takes is added to it (SADD): merely held, not
           running. The client takes an entry out (SREM) when the
           application takes it; requeue-6.lua counts a dead holder's death
           only against entries not in its set. "" or absent: nothing is
           added. (Same slot as KEYS[3]: not declared.)
  ARGV[7]  optional: the service's key prefix, {<service>-input}: (same
           slot, keys not declared): one holder per data stream name (see
           _names.lua). A new entry whose DataStreamName is held by another
           entry still pending in the group waits: it is acked (not
           deleted: it stays in the LBS as its own record), its id is
           appended to the name's waiting list and the name is scored in
           the waiting index; its token is "WAIT <holder's entry id>". The
           holder's release (done-n.lua, requeue-6.lua) puts the oldest
           waiter back into the LBS. A name whose holder is no longer
           pending is taken over. "" or absent: names are not held
           (exclusive per registration only).
  ARGV[8]  optional, with ">": fair dispatch, a window in ms. Idle peers
           are the group's other consumers (XINFO CONSUMERS) that hold
           nothing, read less than this long ago (a live lbs consumer with
           nothing to do reads every read_block) and, with ARGV[7], whose
           lease ARGV[7] .. "lease:" .. <name> exists (it lapses with a dead
           process: a consumer that just died is no peer, and Go consumers,
           which keep none, are never counted). While there are any and
           entries wait, this read takes no more than this consumer's share:
           ceil((entries waiting + what it holds) / (idle peers + 1)) less
           what it holds, at most COUNT. A share already taken reads nothing
           (state "share"). What waits is the group's lag (XINFO GROUPS,
           read first: when nothing waits the consumer list is not read),
           or, when Redis has none (an entry not yet read was deleted),
           counted with XRANGE up to COUNT x (idle peers + 1). "" or absent:
           COUNT. A consumer with nothing pending has a share of at least
           one whatever its peers do: it reads one entry first and counts
           the share (XINFO CONSUMERS, a reply as long as the group's
           consumer list) only when more wait.
  ARGV[9]  optional, with ">": the service's wake group (<service>-wake,
           created with the group, read only with NOACK). When this read
           drains the group, its last-delivered id is set to $ (XGROUP
           SETID; a missing wake group is left to the client's wake read,
           which reports NOGROUP). "" or absent: not touched.
  ARGV[10] optional, with ">" and ARGV[8]: the service's nudge stream,
           {<service>-input}:nudge (same slot, not declared), which the
           wake group ARGV[9] is also created on and every wake read reads
           beside the LBS. When fair dispatch leaves entries waiting for
           idle peers (state "share"), one entry per peer it counted, at
           most one per entry left, is added to it (XADD MAXLEN ~ 100):
           each wakes one peer waiting in the wake group. A drained read
           moves the wake group to its end too. "" or absent: no nudge.
  ARGV[11] optional: the consumer's tokens, {<service>-input}:tokens:
           <consumer id> (a hash; same slot, not declared), for `lbs status`:
           each batch's token as a field, its value "<lease value>|<first
           id>..<last id>" for a read (a read delivers a range of the
           stream, in order), "<lease value>|<id> <id> ..." for a re-read's
           entries no record of this lease covers. The client deletes a field once it finished every entry
           of its batch; leave-3.lua and reap-4.lua delete the hash of a
           consumer that left or died with nothing pending. "": none kept.

  Preconditions, checked before the XREADGROUP (its first write: it
  delivers entries), on both paths; a violation writes nothing:
    * KEYS[3] holds ARGV[4]; otherwise the error "LEASE <what it holds>"
      ("LEASE " alone: it does not exist; "LEASE WRONGTYPE <type>");
    * KEYS[1] does not exist or is a stream (on the ">" path XREADGROUP's
      own first check: its WRONGTYPE becomes "LBSKEY <key> ...");
    * KEYS[2] does not exist, or is a string holding a plain decimal
      integer whose value + COUNT stays below 2^53 ("LBSKEY <key> ...");
    * ARGV[6], when given, does not exist or is a set; ARGV[11], when
      given, does not exist or is a hash.
  A name's holder key, waiting list or the waiting index of another type
  (only looked at once an entry must wait) makes that entry's token
  "WRONGTYPE <type> <key>": nothing of its name is written, it stays
  pending to this consumer, which hands it back.
  Malformed ARGV[3] gives "ERR lbs read-3: ..." (nothing written).

  Output: {entries, tokens, state}
    entries  {{id, {field, value, ...}}, ...} as XREADGROUP returns them (a
             pending entry deleted from the stream comes back with no fields)
    tokens   one per entry: its fencing token (an integer: the entry is
             held by this consumer's lease; one per batch, shared by its
             entries), "WAIT <entry id>" (its name is held by that entry;
             it waits in the name's list) or "WRONGTYPE <type> <key>". A
             re-read ("0") gives each entry the token its lost read
             recorded (ARGV[11]), or a new one.
    state    what the reader does next:
               * "" (a ">" read of COUNT entries, or a re-read): read again
                 at once, more may wait;
               * "drained": the group has nothing more to deliver now (the
                 XREADGROUP gave fewer than COUNT). With ARGV[9] the wake
                 group's last-delivered id is moved to the stream's end;
               * "share": fair dispatch (ARGV[8]) left what waits to idle
                 peers, nudged with ARGV[10]; wait in the wake group as
                 after "drained".

  XREADGROUP runs without BLOCK (scripts cannot block). Between reads that
  drained the group the client sends, in one write, a blocking read of the
  wake group (XREADGROUP GROUP <wake> ... COUNT 1 BLOCK <ms> NOACK STREAMS
  <LBS> <nudge> > >) and then this script, which Redis runs the moment the
  blocking read returns. Tokens come from one counter step per batch, so
  they only grow across every consumer: a later holder of a data stream
  reads it after the earlier one let it go, so its token is larger.

  Events: none besides the keys it writes.
]]
--#include _checks
--#include _fence
--#include _names
--#include _time

local function key_type(key)
  return redis.call('TYPE', key)['ok']
end

-- a < b, for two entry ids ("<ms>-<seq>").
local function id_below(a, b)
  local ams, aseq = string.match(a, '^(%d+)%-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)%-(%d+)$')
  ams, bms = tonumber(ams) or 0, tonumber(bms) or 0
  return ams < bms or (ams == bms and (tonumber(aseq) or 0) < (tonumber(bseq) or 0))
end

-- Preconditions: nothing below this block fails part-way.
if not (ARGV[3] and #ARGV[3] <= 15 and string.match(ARGV[3], '^[1-9]%d*$')) then
  return redis.error_reply('ERR lbs read-3: COUNT (ARGV[3]) must be an integer >= 1')
end
local count = tonumber(ARGV[3])
local new = ARGV[5] == '>'
local function arg(i)  -- an optional argument, nil when "" or absent
  local v = ARGV[i]
  if v == nil or v == '' then return nil end
  return v
end
-- The lease first: a read under a lapsed lease would deliver entries nobody holds.
local lease = redis.pcall('GET', KEYS[3])
if lease ~= ARGV[4] then
  if type(lease) == 'table' then return redis.error_reply('LEASE WRONGTYPE ' .. key_type(KEYS[3])) end
  return redis.error_reply('LEASE ' .. (lease or ''))
end
local queued = new and arg(6) or nil  -- only new entries are ever queued
local record = arg(11)  -- the consumer's tokens hash
local prefix = new and arg(7) or nil  -- one holder per name
local index = prefix and prefix .. 'waiting'
local fair = new and arg(8) and tonumber(ARGV[8])
local wake = new and arg(9) or nil
local nudge_key = new and fair and arg(10) or nil
local misfits
if not new then
  misfits = misfit(KEYS[1], 'stream', 'the load-balancer stream')
  if misfits then return redis.error_reply(misfits) end
end
local fence_error, fence_value = fence_check(KEYS[2], count)
if fence_error then return fence_error end
misfits = misfit(queued, 'set', 'a queued set') or misfit(record, 'hash', "a consumer's tokens")
if misfits then return redis.error_reply(misfits) end

-- Permissions: a user allowed to read but not to write what a read writes would get entries
-- delivered with no token or name, so every later write is checked first.
local function denied(what)
  return redis.error_reply('NOPERM lbs read-3: this user may not run ' .. what .. '; nothing was read')
end
if not redis.acl_check_cmd('TIME') then return denied('TIME') end
if not redis.acl_check_cmd('SET', KEYS[2], '1') then return denied('SET on ' .. KEYS[2]) end
if record and not redis.acl_check_cmd('HSET', record, '1', 'x') then return denied('HSET on ' .. record) end
if new then
  if queued and not redis.acl_check_cmd('SADD', queued, '0-1') then return denied('SADD on ' .. queued) end
  if wake and not redis.acl_check_cmd('XGROUP', 'SETID', KEYS[1], wake, '$') then
    return denied('XGROUP SETID on ' .. KEYS[1])
  end
  if nudge_key then
    if not redis.acl_check_cmd('XADD', nudge_key, 'MAXLEN', '~', '100', '*', 'n', '1') then
      return denied('XADD on ' .. nudge_key)
    end
    if wake and not redis.acl_check_cmd('XGROUP', 'SETID', nudge_key, wake, '$') then
      return denied('XGROUP SETID on ' .. nudge_key)
    end
  end
  if prefix then
    local name = prefix .. 'name:x'
    if not redis.acl_check_cmd('SET', name, '1', 'NX', 'GET') then return denied('SET on ' .. name) end
    if not redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], '0-1') then return denied('XACK on ' .. KEYS[1]) end
    if not redis.acl_check_cmd('RPUSH', prefix .. 'waiting:x', '0-1') then
      return denied('RPUSH on ' .. prefix .. 'waiting:x')
    end
    if not redis.acl_check_cmd('ZADD', index, 'NX', '1', 'x') then return denied('ZADD on ' .. index) end
  end
end

-- The group is drained: the wake group's next read blocks until an XADD (ARGV[9]).
local function drained()
  if wake then
    redis.pcall('XGROUP', 'SETID', KEYS[1], wake, '$')
    -- Nudges nobody read are moot now: they would only wake a consumer to find nothing.
    if nudge_key then redis.pcall('XGROUP', 'SETID', nudge_key, wake, '$') end
  end
  return 'drained'
end

-- Fair dispatch (ARGV[8]): no more than this consumer's share while live peers hold less.
local function field_of(flat, name)
  for j = 1, #flat - 1, 2 do
    if flat[j] == name then return flat[j + 1] end
  end
end
local shared_idle, shared_waiting = 0, 0  -- what fair_count counted: idle peers, entries waiting
local function fair_count(window)
  -- What waits first (XINFO GROUPS, as long as the group list): nothing waits, nothing to share,
  -- and the consumer list (as long as the fleet, with an EXISTS per idle peer) is not read.
  local waiting, last
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
  if type(groups) ~= 'table' or groups.err then return count end  -- no stream: XREADGROUP says so
  for _, g in ipairs(groups) do
    if field_of(g, 'name') == ARGV[1] then
      waiting, last = tonumber(field_of(g, 'lag')), field_of(g, 'last-delivered-id')
    end
  end
  if waiting == 0 or not last then return count end  -- nothing to share, or no group
  local peers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
  if type(peers) ~= 'table' or peers.err then return count end
  local idle, mine = 0, 0
  for _, c in ipairs(peers) do
    local name, pending = field_of(c, 'name'), tonumber(field_of(c, 'pending')) or 0
    if name == ARGV[2] then
      mine = pending
    elseif pending == 0 and (tonumber(field_of(c, 'idle')) or window) < window
           and (not prefix or redis.call('EXISTS', prefix .. 'lease:' .. name) == 1) then
      idle = idle + 1  -- holds nothing, reads, and its process is alive (its lease)
    end
  end
  if idle == 0 then return count end
  if not waiting then  -- Redis cannot tell the lag (an entry not yet read was deleted): count it
    waiting = #redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', count * (idle + 1))
  end
  if waiting == 0 then return count end  -- nothing to share (the read still registers this consumer)
  shared_idle, shared_waiting = idle, waiting
  return math.max(0, math.min(count, math.ceil((waiting + mine) / (idle + 1)) - mine))
end

-- Fair dispatch left `left` entries waiting for the idle peers it counted: wake one peer per entry,
-- up to one per peer (each XADD wakes one consumer waiting in the wake group).
local function share(left)
  if nudge_key then
    for _ = 1, math.min(shared_idle, left) do
      redis.pcall('XADD', nudge_key, 'MAXLEN', '~', '100', '*', 'n', '1')
    end
  end
  return 'share'
end

-- XREADGROUP ... COUNT `c`: the entries, or an error reply to return (its first check is the
-- LBS's type, so a refusal has written nothing).
local function read_group(c)
  local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', c, 'STREAMS', KEYS[1], '>')
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      return nil, redis.error_reply((misfit(KEYS[1], 'stream', 'the load-balancer stream')))
    end
    return nil, reply
  end
  return reply and reply[1] and reply[1][2] or {}
end

local asked, dry = count, false  -- dry: the group has nothing more to deliver
local entries, failed
local taken_after_count = 0  -- entries read after fair_count counted what waits
-- This consumer's oldest pending entry; a refusal (no group, a key of another type) takes the
-- path below, where XREADGROUP's own refusal is the reply.
local mine = fair and redis.pcall('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if type(mine) == 'table' and not mine.err and not mine[1] then
  -- Nothing pending to this consumer, so one entry is within its share whatever its peers
  -- do: read one, and count the share (XINFO) only when more wait. At low rates that is every
  -- read, and XINFO CONSUMERS costs as much as the rest of the call.
  entries, failed = read_group(1)
  if failed then return failed end
  dry = #entries == 0 or (count > 1 and not redis.call('XRANGE', KEYS[1], '(' .. entries[1][1], '+', 'COUNT', 1)[1])
  if not dry and count > 1 then
    local more = math.min(asked - 1, fair_count(fair))  -- the share left, the one just taken counted
    count = 1 + more
    if more > 0 then
      local rest
      rest, failed = read_group(more)
      if failed then return failed end
      dry = #rest < more
      taken_after_count = #rest
      for i = 1, #rest do entries[#entries + 1] = rest[i] end
    end
  end
else
  if fair then
    count = fair_count(fair)
    if count == 0 then return {{}, {}, share(shared_waiting)} end
  end
  if not new then
    -- Our own pending entries, as XREADGROUP's history would list them (a deleted one with no fields).
    entries = {}
    for i, row in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', count, ARGV[2])) do
      entries[i] = redis.call('XRANGE', KEYS[1], row[1], row[1])[1] or {row[1], false}
    end
  else
    entries, failed = read_group(count)
    if failed then return failed end
    dry = #entries < count
    taken_after_count = #entries
  end
end
-- What the reader does next (see Output).
local function state()
  if not new then return '' end
  if dry then return drained() end
  if count < asked then return share(shared_waiting - taken_after_count) end
  return ''
end
local n = #entries
if n == 0 then return {{}, {}, state()} end
local now_ms, t = time_ms()
local tokens = {}
-- One holder per name: an entry whose name another pending entry holds waits (token "WAIT <id>").
-- The common batch (names nobody holds, each once) takes all its names with one MSETNX, which sets
-- every key or none; otherwise (or without +msetnx in the ACL) one SET NX GET per entry.
local function names_at_once()
  local args, seen = {}, {}
  for i = 1, n do
    local name = name_of(entries[i][2])
    if name then
      if seen[name] then return false end
      seen[name] = true
      args[#args + 1] = prefix .. 'name:' .. name
      args[#args + 1] = entries[i][1]
    end
  end
  if #args == 0 then return true end
  if not redis.acl_check_cmd('MSETNX', args[1], args[2]) then return false end
  -- In slices of 500 names; after a refused slice the loop below finds the earlier slices' keys
  -- already holding their own entries' ids.
  for s = 1, #args, 1000 do
    if redis.call('MSETNX', unpack(args, s, math.min(s + 999, #args))) ~= 1 then return false end
  end
  return true
end
local index_kind  -- the waiting index's type, asked when an entry must wait
if prefix and not names_at_once() then
  for i = 1, n do
    local e = entries[i]
    local name = name_of(e[2])
    if name then
      local id, hkey = e[1], prefix .. 'name:' .. name
      local v = redis.pcall('SET', hkey, id, 'NX', 'GET')
      if type(v) == 'table' then
        tokens[i] = 'WRONGTYPE ' .. key_type(hkey) .. ' ' .. hkey
      elseif v then
        local h, marked = name_holder(v)
        if h ~= id then
          if h ~= '' and name_pending(KEYS[1], ARGV[1], h) then
            local wkey = prefix .. 'waiting:' .. name
            local kind = key_type(wkey)
            if index_kind == nil then index_kind = key_type(index) end
            if kind ~= 'none' and kind ~= 'list' then
              tokens[i] = 'WRONGTYPE ' .. kind .. ' ' .. wkey
            elseif index_kind ~= 'none' and index_kind ~= 'zset' then
              tokens[i] = 'WRONGTYPE ' .. index_kind .. ' ' .. index
            else
              redis.call('XACK', KEYS[1], ARGV[1], id)
              redis.call('RPUSH', wkey, id)
              if not marked then redis.call('SET', hkey, h .. '+') end
              redis.call('ZADD', index, 'NX', now_ms + NAME_RECHECK_MS, name)
              tokens[i] = 'WAIT ' .. h
            end
          else
            -- Its holder is gone (not pending): the name is this entry's now.
            redis.call('SET', hkey, marked and (id .. '+') or id)
          end
        end
      end
    end
  end
end
-- Tokens: one counter step per batch, shared by the entries it holds (a later holder of a data
-- stream reads it after this one let it go, so its token is larger), recorded in the tokens hash
-- (ARGV[11]). A re-read finds the tokens its lost read recorded; what no record covers gets a new one.
local held, fresh = {}, {}
for i = 1, n do
  if not tokens[i] then held[#held + 1] = i end
end
if not new and record then
  local found = redis.pcall('HGETALL', record)
  if type(found) ~= 'table' or found.err then found = {} end
  local listed = {}  -- entry id -> token, from records that list their ids
  local ranges = {}  -- {token, first id, last id}
  for j = 1, #found - 1, 2 do
    -- Only what this very lease recorded: another process under this consumer id (it took the lease
    -- over) held those entries under its own token, and this one's must be larger.
    local tok, lease_of, v = tonumber(found[j]), string.match(found[j + 1], '^([^|]*)|(.*)$')
    local lo, hi = string.match(v or '', '^(%S+)%.%.(%S+)$')
    if tok and lease_of == ARGV[4] and lo then
      ranges[#ranges + 1] = {tok, lo, hi}
    elseif tok and lease_of == ARGV[4] then
      for id in string.gmatch(v, '%S+') do listed[id] = tok end
    end
  end
  for _, i in ipairs(held) do
    local id = entries[i][1]
    tokens[i] = listed[id]
    for _, r in ipairs(ranges) do
      if not tokens[i] and not id_below(id, r[2]) and not id_below(r[3], id) then tokens[i] = r[1] end
    end
  end
end
for _, i in ipairs(held) do
  if not tokens[i] then fresh[#fresh + 1] = entries[i][1] end
end
if #fresh > 0 then
  local token = fence_take(KEYS[2], fence_value, 1, t) + 1
  for _, i in ipairs(held) do
    if not tokens[i] then tokens[i] = token end
  end
  if record then
    redis.call('HSET', record, string.format(fence_digits, token),
               ARGV[4] .. '|' .. (new and (fresh[1] .. '..' .. fresh[#fresh]) or table.concat(fresh, ' ')))
  end
end
if queued then
  -- Queued, not running: new entries held go into the consumer's queued set.
  for s = 1, #fresh, 500 do
    redis.call('SADD', queued, unpack(fresh, s, math.min(s + 499, #fresh)))
  end
end
return {entries, tokens, state()}
