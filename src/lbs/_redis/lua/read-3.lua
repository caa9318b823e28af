--[[
  Re-read this consumer's own pending entries under its lease, after a read
  whose reply was lost (reads of new entries are a plain XREADGROUP and the
  take's MULTI, lbs._consumer.take; nothing else calls this script). Each
  entry gets the fencing token its lost read recorded in the consumer's token
  records, or a fresh one from the service's counter; the client then takes
  their names (names-1.lua).

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
  ARGV[3]  most entries to re-read (COUNT), an integer >= 1 (at most 15 digits)
  ARGV[4]  the lease's value (the nonce, "<nonce>.<n>" at its n-th take): nothing is read
           unless KEYS[3] holds it (a lapsed lease holds nothing: entries
           listed now would be held by nobody)
  ARGV[5]  optional: the consumer's tokens, {<service>-input}:tokens:
           <consumer id> (a hash; same slot, not declared), for `lbs status`:
           each batch's token as a field, its value "<lease value>|<first
           id>..<last id>" for a read (a read delivers a range of the
           stream, in order), "<lease value>|<id> <id> ..." for a re-read's
           entries no record of this lease covers. The client deletes a field
           once it finished every entry of its batch; leave-3.lua and
           reap-3.lua delete the hash of a consumer that left or died with
           nothing pending. "" or absent: none kept (every entry gets a
           fresh token).

  The entries are listed with XPENDING and read with XRANGE, not
  XREADGROUP's history (XREADGROUP ... 0), which would count one more
  delivery of each (and a delivery beyond the first is a holder's death to
  requeue-6.lua: a retry nobody caused).

  Preconditions, checked before the first write (the counter's SET); a
  violation writes nothing:
    * KEYS[3] holds ARGV[4]; otherwise the error "LEASE <what it holds>"
      ("LEASE " alone: it does not exist; "LEASE WRONGTYPE <type>");
    * KEYS[1] does not exist or is a stream ("LBSKEY <key> ...");
    * KEYS[2] does not exist, or is a string holding a plain decimal
      integer whose value + COUNT stays below 2^53 ("LBSKEY <key> ...");
    * ARGV[5], when given, does not exist or is a hash ("LBSKEY <key> ...");
    * the ACL allows TIME, SET on KEYS[2] and, with ARGV[5], HSET on it
      ("NOPERM lbs read-3: ...").
  Malformed ARGV[3] gives "ERR lbs read-3: ..." (nothing written). No group
  (or no stream) is XPENDING's own error (NOGROUP).

  Output: {entries, tokens}
    entries  {{id, {field, value, ...}}, ...} as XREADGROUP returns them (a
             pending entry deleted from the stream comes back with no fields),
             oldest first, at most COUNT
    tokens   one per entry, an integer: the token its lost read recorded under
             this very lease (ARGV[5]), or one fresh token shared by every
             entry no record covers (one counter step, recorded in ARGV[5] as
             the ids it covers). Tokens only grow across every consumer: a
             later holder of a data stream reads it after the earlier one let
             it go, so its token is larger.

  Events: none besides the keys it writes.
]]
--#include _checks
--#include _fence

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
-- The lease first: a read under a lapsed lease would list entries nobody holds.
local lease = redis.pcall('GET', KEYS[3])
if lease ~= ARGV[4] then
  if type(lease) == 'table' then return redis.error_reply('LEASE WRONGTYPE ' .. key_type(KEYS[3])) end
  return redis.error_reply('LEASE ' .. (lease or ''))
end
local record = ARGV[5] ~= '' and ARGV[5] or nil  -- the consumer's tokens hash
local misfits = misfit(KEYS[1], 'stream', 'the load-balancer stream')
if misfits then return redis.error_reply(misfits) end
local fence_error, fence_value = fence_check(KEYS[2], count)
if fence_error then return fence_error end
misfits = misfit(record, 'hash', "a consumer's tokens")
if misfits then return redis.error_reply(misfits) end

-- Permissions: a user allowed to read but not to write what a re-read writes would get entries
-- with no token, so every later write is checked first.
local function denied(what)
  return redis.error_reply('NOPERM lbs read-3: this user may not run ' .. what .. '; nothing was read')
end
if not redis.acl_check_cmd('TIME') then return denied('TIME') end
if not redis.acl_check_cmd('SET', KEYS[2], '1') then return denied('SET on ' .. KEYS[2]) end
if record and not redis.acl_check_cmd('HSET', record, '1', 'x') then return denied('HSET on ' .. record) end

-- Our own pending entries, as XREADGROUP's history would list them (a deleted one with no fields).
local entries = {}
for i, row in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', count, ARGV[2])) do
  entries[i] = redis.call('XRANGE', KEYS[1], row[1], row[1])[1] or {row[1], false}
end
local n = #entries
if n == 0 then return {{}, {}} end

-- Tokens: what the lost read recorded (ARGV[5]) under this very lease; what no record covers gets
-- one new token (one counter step), recorded with the ids it covers.
local tokens = {}
if record then
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
  for i = 1, n do
    local id = entries[i][1]
    tokens[i] = listed[id]
    for _, r in ipairs(ranges) do
      if not tokens[i] and not id_below(id, r[2]) and not id_below(r[3], id) then tokens[i] = r[1] end
    end
  end
end
local fresh = {}
for i = 1, n do
  if not tokens[i] then fresh[#fresh + 1] = entries[i][1] end
end
if #fresh > 0 then
  local token = fence_take(KEYS[2], fence_value, 1, redis.call('TIME')) + 1
  for i = 1, n do
    if not tokens[i] then tokens[i] = token end
  end
  if record then
    redis.call('HSET', record, string.format(fence_digits, token), ARGV[4] .. '|' .. table.concat(fresh, ' '))
  end
end
return {entries, tokens}
