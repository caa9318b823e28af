--[[
  Read a batch of assignments for one consumer and lock every one of them,
  atomically: an entry is never delivered (pending) without a lock, and a
  consumer never holds a lock without a place in the consumer deadline
  index, so one that dies at any moment leaves only locked work, which
  recovery's deadline poller brings back within the lock TTL.

  KEYS[1]  the load-balancer stream, <service>-input
  KEYS[2]  the service's fencing counter, {<service>-input}:fence: a plain
           decimal integer. When it does not exist (a restart without
           persistence, an eviction) or is below the server time in
           microseconds (TIME: sec * 1000000 + usec; a failover to a replica
           that missed the last tokens) the ">" path sets it to that time
           before its INCRBY, so tokens never go backwards (_fence.lua).
  KEYS[3]  the consumer deadline index, {<service>-input}:consumers (a
           sorted set: consumer id scored by server ms). A consumer taking
           locks is added with now + TTL if absent; an existing score (its
           last heartbeat's, earlier than these locks' expiry) is kept, so
           the poller never looks later than the oldest of its locks expire.

  ARGV[1]  consumer group
  ARGV[2]  consumer id: the consumer name in the group and in KEYS[3]
  ARGV[3]  most entries to read (COUNT), an integer >= 1 (at most 15 digits)
  ARGV[4]  lock TTL in milliseconds, an integer >= 1 (at most 15 digits)
  ARGV[5]  lock key prefix, lock:{<service>-input}: (lock keys share the
           LBS's hash tag, so they live in this slot)
  ARGV[6]  ">" for new entries; "0" to re-read this consumer's own pending
           entries (after a read whose reply was lost): listed with XPENDING
           and read with XRANGE, not XREADGROUP's history, which would count
           one more delivery of each (and a delivery beyond the first is a
           holder's death to requeue-6.lua: a retry nobody caused)
  ARGV[7]  optional, with ">": also claim pending entries idle at least this
           many ms (XREADGROUP ... CLAIM, Redis >= 8.4); "" or absent: none.
           Claimed entries come first, as 4-element entries (id, fields,
           idle ms, earlier deliveries), and are locked like new ones: one
           whose lock is held (a live holder) gets its holder's value as its
           token and is left to it.
  ARGV[8]  optional: the lock owner; lock values are "<token>:<ARGV[8]>".
           "" or absent: ARGV[2], i.e. "<token>:<consumer id>". (The client
           passes "<consumer id>:<instance nonce>", so that adopting locks
           after a lost reply takes only this very process's locks.)
  ARGV[9]  optional: "1" when the server has MSETEX (Redis >= 8.4): the
           locks of up to 500 entries are then taken by one MSETEX ... NX
           PXAT, which sets all of them or none; a slice where any lock
           exists falls back to one SET NX per entry. "" or absent, or a
           user the ACL denies MSETEX: SET NX per entry.
  ARGV[10] optional, beside a Go reference client v0.4 fleet
           (Config.go_compatible): its lock key separator,
           "<MUTEX_KEY_SEP>". An entry claimed with ARGV[7] whose Go-style
           lock "<DataStreamName><sep><entry id>" exists is a live Go
           holder's: its token is "Go consumer <the lock's value>" and no
           lock of ours is taken (it stays pending, left to its holder).
           The key is outside the service's slot: single Redis only.
  ARGV[11] optional: the reading consumer's queued set, {<service>-input}:
           queued:<consumer id>, when the reader queues what it takes
           instead of starting a handler at once (the notification API):
           every new entry it locks is added to it (SADD): merely held, not
           running. The client takes an entry out (SREM) when the
           application takes it; requeue-6.lua counts a dead holder's death
           only against entries not in its set. Claimed entries (ARGV[7])
           are never added: they count as running from delivery. "" or
           absent: nothing is added. (Same slot as KEYS[3]: not declared.)
  ARGV[12] optional: the service's key prefix, {<service>-input}: (same
           slot, keys not declared): one holder per data stream name (see
           _names.lua). A new or claimed entry whose DataStreamName is held
           by another entry still pending in the group waits: it is acked
           (not deleted: it stays in the LBS as its own record), its id is
           appended to the name's waiting list and the name is scored in
           the waiting index; no lock is taken and its token is
           "WAIT <holder's entry id>". The holder's release (done-n.lua,
           requeue-6.lua) puts the oldest waiter back into the LBS. A name
           whose holder is no longer pending is taken over. "" or absent:
           names are not locked (exclusive per registration only).
  ARGV[13] optional, with ">": fair dispatch, a window in ms. Idle peers
           are the group's other consumers (XINFO CONSUMERS) that hold
           nothing, read less than this long ago (a live lbs consumer with
           nothing to do reads every read_block) and, with ARGV[12], whose
           instance marker ARGV[12] .. "instance:" .. <name> exists (it
           lapses with a dead process's locks: a consumer that just died is
           no peer, and Go consumers, which keep none, are never counted).
           While there are any
           and entries wait, this read takes no more than this consumer's
           share: ceil((entries waiting + what it holds) / (idle peers +
           1)) less what it holds, at most COUNT. A share already taken
           reads nothing (state "share"). What waits is the group's lag
           (XINFO GROUPS, read first: when nothing waits the consumer list
           is not read), or, when Redis has none (an entry not yet read was
           deleted), counted with XRANGE up to COUNT x (idle peers + 1).
           "" or absent: COUNT.
           Without CLAIM, a consumer with nothing pending has a share of at least one
           whatever its peers do: it reads one entry first and counts the
           share (XINFO CONSUMERS, a reply as long as the group's consumer
           list) only when more wait, so a read at a low rate costs one
           XPENDING of its own list and one XRANGE instead.
  ARGV[14] optional, with ">": the service's wake group (<service>-wake,
           created with the group, read only with NOACK). When this read
           drains the group, its last-delivered id is set to $ (XGROUP
           SETID; a missing wake group is left to the client's wake read,
           which reports NOGROUP). "" or absent: not touched.
  ARGV[15] optional, with ">" and ARGV[13]: the service's nudge stream,
           {<service>-input}:nudge (same slot, not declared), which the
           wake group ARGV[14] is also created on and every wake read
           reads beside the LBS. When fair dispatch leaves entries waiting
           for idle peers (state "share"), one entry per peer it counted,
           at most one per entry left, is added to it (XADD MAXLEN ~ 100):
           each wakes one peer waiting in the wake group, so the work is
           taken now and not at the peer's next read_block (the XADD that
           registered it woke only this consumer, and XGROUP SETID wakes
           nobody). A drained read moves the wake group to its end too.
           A key of another type is left alone (the wake read reports it).
           "" or absent: no nudge.

  Preconditions, checked before the XREADGROUP (its first write: it
  delivers entries), on both paths; a violation writes nothing and returns
  the error "LBSKEY <key name> <what is wrong>":
    * KEYS[1] does not exist or is a stream (on the ">" path XREADGROUP's
      own first check: its WRONGTYPE becomes this error);
    * KEYS[2] does not exist, or is a string holding a plain decimal
      integer ("0" or digits without a leading zero, which INCRBY would
      refuse; at most 16 digits, as a seed from the clock has 16) whose
      value + COUNT stays below 2^53 (9007199254740992): Lua numbers are
      doubles, and a token past 2^53 would lose precision;
    * KEYS[3] does not exist or is a sorted set;
    * ARGV[11], when given, does not exist or is a set.
  A name's holder key, waiting list or the waiting index ARGV[12] ..
  "waiting" of another type (only looked at once an entry must wait) makes
  that entry's token "WRONGTYPE <type> <key>": no lock
  is taken, nothing of its name is written, it stays pending (the scan
  brings it back once the key is removed), as with a lock key of another
  type.
  Malformed ARGV[3] / ARGV[4] give "ERR lbs read-3: ..." (nothing written).

  Output: {entries, tokens, top}
    entries  {{id, {field, value, ...}}, ...} as XREADGROUP returns them (a
             pending entry deleted from the stream comes back with no fields)
    tokens   one per entry:
               * the new fencing token (an integer): the lock is ours;
               * the lock value already set (a string: "<token>:<owner>" of
                 its holder);
               * "WAIT <entry id>" (a string): its name is held by that
                 entry; it waits in the name's list (ARGV[12]);
               * "WRONGTYPE <type>" (a string) when the lock key exists
                 with another type than string (garbage nobody can hold):
                 no lock is taken; the client logs an error naming the key
                 and leaves the entry pending, and the scan brings it back
                 once the key is removed.
             Re-reading ("0") takes no lock: it reports each lock's value,
             "" for none, or "WRONGTYPE <type>", so the client adopts the
             locks a lost reply had taken for it.
    state    what the reader does next:
               * "" (a ">" read of COUNT entries, or a re-read): read again
                 at once, more may wait;
               * "drained": the group has nothing more to deliver now (the
                 XREADGROUP gave fewer than COUNT). With ARGV[14] the wake
                 group's last-delivered id is moved to the stream's end
                 ($), so a wake read blocks until the next XADD;
               * "share": fair dispatch (ARGV[13]) left what waits to idle
                 peers, nudged with ARGV[15]; wait in the wake group as
                 after "drained" (an XADD or a nudge wakes it; after
                 read_block it reads again anyway, for peers that died).

  XREADGROUP runs without BLOCK (scripts cannot block). Between reads that
  drained the group the client sends, in one write, a blocking read of the
  wake group (ARGV[14]: XREADGROUP GROUP <wake> ... COUNT 1 BLOCK <ms>
  NOACK STREAMS <LBS> <nudge> > >) and then this script: Redis runs the script the
  moment the blocking read returns (a client's later commands wait while it
  is blocked), so an XADD wakes one consumer, which reads and locks in the
  same turn of the server's loop; no entry is ever delivered in the group
  without its lock. The wake group's reply is ignored: it only wakes.
  Tokens come from one INCRBY per batch, so they are unique and only grow
  across every consumer.

  Events: none besides the keys it writes.
]]
--#include _checks
--#include _fence
--#include _names
--#include _time

local function key_type(key)
  return redis.call('TYPE', key)['ok']
end

-- Preconditions: nothing below this block fails part-way.
local function positive(s)  -- digits without a leading zero, as Redis parses them
  return s and #s <= 15 and string.match(s, '^[1-9]%d*$') ~= nil
end
if not positive(ARGV[3]) then
  return redis.error_reply('ERR lbs read-3: COUNT (ARGV[3]) must be an integer >= 1')
end
if not positive(ARGV[4]) then
  return redis.error_reply('ERR lbs read-3: lock TTL (ARGV[4]) must be an integer >= 1 (ms)')
end
local count, ttl = tonumber(ARGV[3]), ARGV[4]
local ttl_ms = tonumber(ttl)
-- The nudge stream (ARGV[15]): idle peers left a share are woken through it.
local nudge_key = ARGV[6] == '>' and ARGV[15] and ARGV[15] ~= '' and ARGV[15] or nil
-- The queued set (ARGV[11]): only new entries (">") are ever added.
local queued = ARGV[6] == '>' and ARGV[11] and ARGV[11] ~= '' and ARGV[11] or nil
-- One holder per name (ARGV[12]): the waiting index.
local prefix = ARGV[6] == '>' and ARGV[12] and ARGV[12] ~= '' and ARGV[12] or nil
local index = prefix and prefix .. 'waiting'
-- The checks cost one call per key: the LBS's type is XREADGROUP's own first check (see
-- read_group), the counter's and the index's are a GET and a ZSCORE that fail on another type,
-- and the waiting index is looked at only when an entry must wait.
local misfits
if ARGV[6] ~= '>' then
  misfits = misfit(KEYS[1], 'stream', 'the load-balancer stream')
  if misfits then return redis.error_reply(misfits) end
end
local fence_error, fence_value = fence_check(KEYS[2], count)
if fence_error then return fence_error end
local indexed = redis.pcall('ZSCORE', KEYS[3], ARGV[2])  -- this consumer's deadline, false if absent
if type(indexed) == 'table' then
  return redis.error_reply((misfit(KEYS[3], 'zset', 'the consumer deadline index')))
end
misfits = misfit(queued, 'set', 'a queued set')
if misfits then return redis.error_reply(misfits) end

-- Permissions: a user allowed to read but not to take the locks would get
-- entries delivered with no lock, so every later write is checked first
-- (one check per command, no table built: this runs on every read).
local function denied(what)
  return redis.error_reply('NOPERM lbs read-3: this user may not run ' .. what .. '; nothing was read')
end
if ARGV[6] == '>' then
  local lock = ARGV[5] .. '0-1'
  if not redis.acl_check_cmd('TIME') then return denied('TIME') end
  if not redis.acl_check_cmd('SET', KEYS[2], '1') then return denied('SET on ' .. KEYS[2]) end
  if not redis.acl_check_cmd('INCRBY', KEYS[2], '1') then return denied('INCRBY on ' .. KEYS[2]) end
  if not redis.acl_check_cmd('SET', lock, '1', 'NX', 'PXAT', '1') then return denied('SET on ' .. lock) end
  if not redis.acl_check_cmd('ZADD', KEYS[3], 'NX', '1', ARGV[2]) then return denied('ZADD on ' .. KEYS[3]) end
  if queued and not redis.acl_check_cmd('SADD', queued, '0-1') then return denied('SADD on ' .. queued) end
  if ARGV[14] and ARGV[14] ~= '' and not redis.acl_check_cmd('XGROUP', 'SETID', KEYS[1], ARGV[14], '$') then
    return denied('XGROUP SETID on ' .. KEYS[1])
  end
  if nudge_key then
    if not redis.acl_check_cmd('XADD', nudge_key, 'MAXLEN', '~', '100', '*', 'n', '1') then
      return denied('XADD on ' .. nudge_key)
    end
    if ARGV[14] and ARGV[14] ~= '' and not redis.acl_check_cmd('XGROUP', 'SETID', nudge_key, ARGV[14], '$') then
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

-- MSETEX where the server has it and the user may run it (an ACL written
-- without +msetex still reads, one SET per lock).
local msetex = ARGV[6] == '>' and ARGV[9] == '1' and
               redis.acl_check_cmd('MSETEX', '1', ARGV[5] .. '0-1', '1', 'NX', 'PXAT', '1')

-- A lock key's value, "" when absent, "WRONGTYPE <type>" when not a string.
local function lock_value(lock)
  local v = redis.pcall('GET', lock)
  if type(v) == 'table' and v.err then
    return 'WRONGTYPE ' .. key_type(lock)
  end
  return v or ''
end

-- The group is drained: the wake group's next read blocks until an XADD (ARGV[14]).
local wake = ARGV[6] == '>' and ARGV[14] and ARGV[14] ~= '' and ARGV[14] or nil
local function drained()
  if wake then
    redis.pcall('XGROUP', 'SETID', KEYS[1], wake, '$')
    -- Nudges nobody read are moot now: they would only wake a consumer to find nothing.
    if nudge_key then redis.pcall('XGROUP', 'SETID', nudge_key, wake, '$') end
  end
  return 'drained'
end

-- Fair dispatch (ARGV[13]): no more than this consumer's share while live peers hold less.
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
           and (not prefix or redis.call('EXISTS', prefix .. 'instance:' .. name) == 1) then
      idle = idle + 1  -- holds nothing, reads, and its process is alive (its instance marker)
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
  local reply
  if ARGV[7] and ARGV[7] ~= '' then
    reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', c, 'CLAIM', ARGV[7],
                        'STREAMS', KEYS[1], '>')
  else
    reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', c, 'STREAMS', KEYS[1], '>')
  end
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
local fair = ARGV[6] == '>' and ARGV[13] and ARGV[13] ~= '' and tonumber(ARGV[13])
-- This consumer's oldest pending entry; a refusal (no group, a key of another type) takes the
-- path below, where XREADGROUP's own refusal is the reply.
local mine = fair and not (ARGV[7] and ARGV[7] ~= '') and
             redis.pcall('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
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
  if ARGV[6] ~= '>' then
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
  if ARGV[6] ~= '>' then return '' end
  if dry then return drained() end
  if count < asked then return share(shared_waiting - taken_after_count) end
  return ''
end
local n = #entries
if n == 0 then return {{}, {}, state()} end
local tokens, taken = {}, false
if ARGV[6] ~= '>' then
  -- Re-reading our own pending entries: report their locks, take none.
  -- An unlocked one was disowned (its handler may still run); the deadline
  -- poller or the scan re-queues it.
  for i = 1, n do
    tokens[i] = lock_value(ARGV[5] .. entries[i][1])
  end
  return {entries, tokens, ''}
end
local owner = ARGV[8]
if not owner or owner == '' then owner = ARGV[2] end
-- Beside a Go fleet: claimed entries a live Go consumer holds (its lock exists).
local preset = {}
local go_sep = ARGV[10]
if go_sep and go_sep ~= '' and ARGV[7] and ARGV[7] ~= '' then
  for i = 1, n do
    local e = entries[i]
    local name = tonumber(e[4]) and tonumber(e[4]) > 0 and name_of(e[2])
    if name then
      local v = redis.pcall('GET', name .. go_sep .. e[1])
      if type(v) == 'table' then  -- not a string: not a lock we may take over
        preset[i] = 'Go consumer (a key of another type)'
      elseif v then
        preset[i] = 'Go consumer ' .. v
      end
    end
  end
end
local now_ms, t = time_ms()
-- One holder per name: an entry whose name another pending entry holds waits (token "WAIT <id>").
-- The common batch (names nobody holds, each once) takes all its names with one MSETNX, which sets
-- every key or none; otherwise (or without +msetnx in the ACL) one SET NX GET per entry.
local function names_at_once()
  local args, seen = {}, {}
  for i = 1, n do
    local name = not preset[i] and name_of(entries[i][2])
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
    local name = not preset[i] and name_of(e[2])
    if name then
      local id, hkey = e[1], prefix .. 'name:' .. name
      local v = redis.pcall('SET', hkey, id, 'NX', 'GET')
      if type(v) == 'table' then
        preset[i] = 'WRONGTYPE ' .. key_type(hkey) .. ' ' .. hkey
      elseif v then
        local h, marked = name_holder(v)
        if h ~= id then
          if h ~= '' and name_pending(KEYS[1], ARGV[1], h) then
            local wkey = prefix .. 'waiting:' .. name
            local kind = key_type(wkey)
            if index_kind == nil then index_kind = key_type(index) end
            if kind ~= 'none' and kind ~= 'list' then
              preset[i] = 'WRONGTYPE ' .. kind .. ' ' .. wkey
            elseif index_kind ~= 'none' and index_kind ~= 'zset' then
              preset[i] = 'WRONGTYPE ' .. index_kind .. ' ' .. index
            else
              redis.call('XACK', KEYS[1], ARGV[1], id)
              redis.call('RPUSH', wkey, id)
              if not marked then redis.call('SET', hkey, h .. '+') end
              redis.call('ZADD', index, 'NX', now_ms + NAME_RECHECK_MS, name)
              preset[i] = 'WAIT ' .. h
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
local first = fence_take(KEYS[2], fence_value, n, t)
local deadline = now_ms + ttl_ms
local digits = fence_digits
-- What gets a lock of ours: every entry but those a Go consumer holds or that wait for their name.
local todo = {}
for i = 1, n do
  if preset[i] then tokens[i] = preset[i] else todo[#todo + 1] = i end
end
-- PXAT the deadline: the lock expires exactly when the index says it may.
local function lock_each(s, e)
  for j = s, e do
    local i = todo[j]
    local lock = ARGV[5] .. entries[i][1]
    if redis.call('SET', lock, string.format(digits, first + i) .. ':' .. owner, 'NX', 'PXAT', deadline) then
      tokens[i] = first + i
      taken = true
    else
      tokens[i] = lock_value(lock)
    end
  end
end
if msetex then
  for s = 1, #todo, 500 do
    local e, args = math.min(s + 499, #todo), {}
    for j = s, e do
      local i = todo[j]
      args[#args + 1] = ARGV[5] .. entries[i][1]
      args[#args + 1] = string.format(digits, first + i) .. ':' .. owner
    end
    args[#args + 1], args[#args + 2], args[#args + 3] = 'NX', 'PXAT', deadline
    if redis.call('MSETEX', e - s + 1, unpack(args)) == 1 then
      for j = s, e do tokens[todo[j]] = first + todo[j] end
      taken = true
    else
      lock_each(s, e)
    end
  end
else
  lock_each(1, #todo)
end
if taken and not indexed then
  redis.call('ZADD', KEYS[3], 'NX', deadline, ARGV[2])
end
if queued then
  -- Queued, not running: new entries whose lock we took go into the consumer's queued set.
  local held = {}
  for i = 1, n do
    local e = entries[i]
    if type(tokens[i]) == 'number' and not (tonumber(e[4]) and tonumber(e[4]) > 0) then
      held[#held + 1] = e[1]
    end
  end
  for s = 1, #held, 500 do
    redis.call('SADD', queued, unpack(held, s, math.min(s + 499, #held)))
  end
end
return {entries, tokens, state()}
