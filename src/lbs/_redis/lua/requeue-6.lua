--[[
  Put an assignment back into circulation as a fresh entry, park it to come
  back after a retry delay, or put it into the dead-letter stream, in one
  atomic step: there is no moment at which a crash loses it.

  KEYS[1]  the load-balancer stream, <service>-input
  KEYS[2]  the dead-letter stream, {<service>-input}:dlq
  KEYS[3]  the lease key prefix, {<service>-input}:lease: (declared for its
           slot: a consumer's lease is this plus its id)
  KEYS[4]  the parking stream of delayed retries, {<service>-input}:delayed
  KEYS[5]  the due index, {<service>-input}:due: a sorted set of the ids of
           KEYS[4]'s entries, each scored by the server time (ms) at which
           promote-4.lua moves it back into the LBS
  KEYS[6]  optional: the pardons, {<service>-input}:pardons: a sorted set of
           the ids of entries whose holder lost them while it lived (a
           partition, a stall longer than the lease TTL) although another
           consumer's recovery counted a death against them (the holder
           adds them when it is back, scored by the time, ms)

  ARGV[1]   consumer group
  ARGV[2]   entry id
  ARGV[3]   holder mode: "owned" (the entry must be pending to ARGV[10] and
            its lease KEYS[3] .. ARGV[10] hold ARGV[4]), "absent" (the
            lease of the consumer it is pending to must not exist: its
            holder is gone), "restart" (as "owned", for what an earlier
            process under our consumer id left: a death counts as in
            "absent"), "any" (not checked)
  ARGV[4]   our lease value, for mode "owned"
  ARGV[5]   retry increment: "0" (hand-back on shutdown) or "1" (a failure).
            In mode "absent" (its holder is gone) a "1" counts only when the
            entry is not in its holder's queued set (ARGV[19]): the take
            (lbs._consumer.take) adds what a client merely holds (queued for its application),
            and the client takes it out once the application takes it. A death
            counted so also appends the entry id to the copy's
            <prefix>deaths (space-separated, the latest 32 kept): when a
            later call finds one of them in KEYS[6] it takes that retry back
            (and drops the id)
  ARGV[6]   max retries: past it the entry is dead-lettered; "-1" = never (and never
            an entry with the field lbs-keyed: a key's registration, publish-1.lua)
  ARGV[7]   retry count field name (default "_retry_count")
  ARGV[8]   original id field name (default "_original_id")
  ARGV[9]   reason, recorded in dead letters
  ARGV[10]  consumer id, recorded in dead letters
  ARGV[11]  "1" to dead-letter unconditionally (malformed entries)
  ARGV[12]  "1" when a dead-letter stream is configured; "0" drops instead
  ARGV[13]  the managed-field prefix (default "_"): dead letters get
            <prefix>reason, <prefix>consumer and <prefix>failed_id
  ARGV[14]  retry delay (ms) at retry count 1: "0" re-queues at once;
            otherwise the copy is parked (KEYS[4], KEYS[5]) for
            d = min(ARGV[14] * 2^(n-1), ARGV[15]) * ARGV[16] ms, n the
            copy's retry count (at least 1), rounded down; a d of 0
            re-queues at once
  ARGV[15]  longest retry delay (ms)
  ARGV[16]  the caller's jitter: a factor in [0.5, 1] (so d is uniform in
            [d/2, d] when the caller draws it uniformly); "1" for a fixed delay
  ARGV[17]  beside a Go reference client v0.4 fleet (Config.go_compatible):
            its lock key separator, "<MUTEX_KEY_SEP>"; "" (or absent)
            otherwise. In mode "absent" an entry whose Go-style lock
            "<DataStreamName><sep><entry id>" exists is held by a live Go
            consumer: nothing is touched ({0, "go lock"}). The key is outside
            the service's slot: single Redis only, as the Go client is.
  ARGV[18]  mode "owned" beside a Go fleet: the DataStreamName, whose
            Go-style lock "<ARGV[18]><ARGV[17]><entry id>" is released with ours
  ARGV[19]  optional: the queued sets' prefix, {<service>-input}:queued:; the
            holder's set is this plus its consumer name (from XPENDING; same
            slot, not declared). An entry in it was merely held (see ARGV[5]);
            it leaves the set when the entry is re-queued, parked,
            dead-lettered or found trimmed. "" or absent: not looked at.
  ARGV[20]  optional: the failure's traceback, recorded in a dead letter as
            <prefix>traceback ("" or absent: no such field)
  ARGV[21]  optional: the service's key prefix, {<service>-input}: (one
            holder per name, _names.lua; same slot, keys not declared):
            once the entry is re-queued, parked or dead-lettered (codes 1-4)
            it releases its DataStreamName if it holds it, and the oldest
            registration waiting for the name goes back into the LBS (after
            the copy). "" or absent: names untouched
  ARGV[22]  optional, beside a Go fleet in mode "absent": the least idle
            time (ms) of an entry it re-queues (the client passes 1 s, or
            the lease TTL when shorter). The Go
            client's Claim moves an entry (XCLAIM, idle reset to 0) and takes
            its Go-style lock one round trip later; an entry of a dead holder
            has been idle at least its lock's TTL (it expired). An entry
            idle less was just claimed: nothing is touched ({0, "claimed"}).
            "" or absent: not checked.
  ARGV[23]  optional: n, how many fields the caller sets on the copy (a
            plugin's, e.g. the failed attempt's trace context); the 2n
            arguments after it are their names and values, each replacing the
            entry's own field of that name. "0" or absent: none

  Order: every check comes before the first write, and the copy is added
  before the original is acked, so no state of Redis stops it part-way:
    1. in mode "owned" our lease (GET through pcall: a key of another type
       is nobody's lease we hold), then with ARGV[18] the Go-style lock;
    2. pending? (XPENDING <LBS> <group> <id> <id> 1, read-only; no group
       or no stream: not pending). If not, nothing is touched; in mode
       "owned" pending to another consumer, nothing is touched; in mode
       "absent" its holder's lease (EXISTS; a key of another type counts
       as alive) must not exist;
    3. the entry (XRANGE). Gone: its pending reference is acked; then,
       with ARGV[17] in mode "absent", its Go-style lock;
    4. the target: the LBS (re-queue), the parking stream and due index
       (park) or the dead-letter stream. The dead-letter stream and the
       parking stream must not exist or be streams, the due index must not
       exist or be a sorted set, else nothing is touched;
    5. XADD the copy (parked: XADD to KEYS[4], then ZADD its id to KEYS[5]
       at the time of its id's milliseconds + d, so the stored delay is
       exactly d), XACK, XDEL the original (and our Go-style lock).

  Copies: the entry's fields (those named after ARGV[23] replaced), the retry count (+ the deaths counted while
  it was pending, its delivery count less one, + ARGV[5], less pardoned
  deaths; each pardon takes one back and is removed), the original id and <prefix>deaths when any (a parked copy too: it goes back into the LBS as it is); dead letters
  also get <prefix>reason, <prefix>consumer, <prefix>failed_id and, with
  ARGV[20], <prefix>traceback. A copy
  of more than 7,000 values (fields and values counted apart) cannot be
  passed through Lua's unpack: such an entry is dead-lettered whatever its
  retry count (never parked), with only lbs-input (if present), the retry
  count and original id fields, <prefix>reason = "entry has <N> fields,
  too many to copy; kept in <LBS key> as <id>" (followed by "; <ARGV[9]>"
  when a reason was given), <prefix>consumer and <prefix>failed_id. It is
  acked but NOT deleted: the original, with all its fields, stays in the
  LBS as the record. Without a dead-letter stream (ARGV[12] not "1") it is
  likewise acked, not deleted: code 3. Past max retries an entry is
  dead-lettered at once, whatever ARGV[14].

  Output: {code, detail, lbs-input, retry count[, delay ms]}
    {1, new id, ...}       re-queued as a fresh entry
    {2, dlq id, ...}       dead-lettered
    {3, "", ...}           dropped (dead letter wanted, no dead-letter stream)
    {4, parked id, ..., d} parked in KEYS[4] for d ms (due at the parked
                           id's milliseconds + d, in KEYS[5])
    {0, "lock"}            holder check failed: nothing touched (mode
                           "owned": not pending to us under this lease;
                           "absent": its holder's lease lives)
    {0, "claimed"}         just claimed (idle less than ARGV[22]): nothing
                           touched
    {0, "go lock"}         a Go consumer holds it (ARGV[17]): nothing touched
    {0, "acked"}           not pending (someone else already handled it)
    {-1, "trimmed"}        the entry is gone from the stream; its pending
                           reference was cleaned
    {-2, message}          a precondition failed, nothing touched; message:
                           "LBSKEY <key> holds a <type>, not a stream" (KEYS[2]
                           or KEYS[4]) or "LBSKEY <KEYS[5]> holds a <type>,
                           not the due index"

  Events: xadd on the LBS, the parking stream or the dead-letter stream;
  zadd on the due index; del on our Go-style lock; a released name's as in
  done-n.lua.
]]
--#include _checks
--#include _names
--#include _time
local MAX_COPY = 7000
local mode = ARGV[3]
-- The fields the caller sets on the copy (ARGV[23]: how many; the pairs follow).
local set_n = math.max(math.floor(tonumber(ARGV[23] or '0') or 0), 0)
local set = {}
for j = 1, set_n do
  if ARGV[22 + 2 * j] ~= nil then set[ARGV[22 + 2 * j]] = true end
end

-- 1. Our lease (modes "owned", "restart").
local ours = mode == 'owned' or mode == 'restart'
if ours and redis.pcall('GET', KEYS[3] .. ARGV[10]) ~= ARGV[4] then
  return {0, 'lock'}
end
local go_sep = ARGV[17]
-- Mode "owned" beside a Go fleet: our Go-style lock, released with the entry.
local go_lock = mode == 'owned' and go_sep and go_sep ~= '' and ARGV[18] and ARGV[18] .. go_sep .. ARGV[2]
if go_lock then
  local g = redis.pcall('GET', go_lock)
  if g and g ~= ARGV[10] then
    return {0, 'go lock'}
  elseif not g then
    go_lock = nil
  end
end
local function release()
  if go_lock then redis.call('DEL', go_lock) end
end

-- 2. Still pending, and to whom?
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if type(p) ~= 'table' or not p[1] then
  return {0, 'acked'}
end
if ours and p[1][2] ~= ARGV[10] then
  return {0, 'lock'}
elseif mode == 'absent' and redis.call('EXISTS', KEYS[3] .. p[1][2]) == 1 then
  return {0, 'lock'}
end
-- Mode "absent" beside a Go fleet: not just claimed (the Go client's Claim is two steps)?
if mode == 'absent' and ARGV[22] and ARGV[22] ~= '' and tonumber(p[1][3]) < tonumber(ARGV[22]) then
  return {0, 'claimed'}
end

-- Merely held by its holder (queued for its application, never taken)?
local qkey = ARGV[19] and ARGV[19] ~= '' and (ARGV[19] .. p[1][2]) or nil
local queued = qkey ~= nil and redis.pcall('SISMEMBER', qkey, ARGV[2]) == 1
local function unqueue()
  if queued then redis.pcall('SREM', qkey, ARGV[2]) end
end

-- 3. The entry.
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found == 0 then
  redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
  release()
  unqueue()
  return {-1, 'trimmed'}
end

local fields = found[1][2]
-- A dead holder's death counts only against what it was running, not what it merely held (ARGV[5]).
local increment = tonumber(ARGV[5])
local died = (mode == 'absent' or mode == 'restart') and increment > 0
if died and queued then
  increment, died = 0, false
end

-- 3b. Beside a Go fleet: a live Go holder's lock (its key needs the data stream's name).
local name = name_of(fields)
if mode == 'absent' and go_sep and go_sep ~= '' and name and redis.call('EXISTS', name .. go_sep .. ARGV[2]) == 1 then
  return {0, 'go lock'}
end

-- 4. The copy and its target.
local retry_field, original_field, deaths_field = ARGV[7], ARGV[8], ARGV[13] .. 'deaths'
local out = {}
local retries = 0
local original = ARGV[2]
local input, keyed, deaths
for i = 1, #fields, 2 do
  local k, v = fields[i], fields[i + 1]
  if k == 'lbs-input' then input = v end
  if k == 'lbs-keyed' then keyed = v end
  if k == retry_field then
    retries = tonumber(v) or 0
  elseif k == original_field then
    original = v
  elseif k == deaths_field then
    deaths = v
  elseif set[k] then
    -- replaced by the caller's value (added below)
  else
    out[#out + 1] = k
    out[#out + 1] = v
  end
end
-- Deaths counted while the entry was pending: its delivery count less one (an XCLAIM or XREADGROUP
-- CLAIM that moved it under its id counted one there; lbs's own recovery no longer does), carried
-- into the copy like those of earlier copies.
local before = math.min(math.max(tonumber(p[1][4]) - 1, 0), 32)
retries = retries + before
local counted = {}
if deaths then
  for d in string.gmatch(deaths, '%S+') do counted[#counted + 1] = d end
end
for _ = 1, before do counted[#counted + 1] = ARGV[2] end
-- Deaths counted while the holder in fact lived (it pardoned them since): taken back, one per pardon
-- (the pardons used are removed with the writes, below).
local kept, used = {}, {}
for _, d in ipairs(counted) do
  local pardoned = KEYS[6] and not used[d] and redis.pcall('ZSCORE', KEYS[6], d)
  if type(pardoned) == 'string' then
    retries = math.max(retries - 1, 0)
    used[d] = true
  else
    kept[#kept + 1] = d
  end
end
if died then kept[#kept + 1] = ARGV[2] end
while #kept > 32 do table.remove(kept, 1) end
retries = retries + increment
local traced = ARGV[20] ~= nil and ARGV[20] ~= ''
-- The copy with its bookkeeping fields (and a dead letter's traceback).
local oversized = #out + 10 + 2 * set_n + (#kept > 0 and 2 or 0) + (traced and 2 or 0) > MAX_COPY
if oversized then
  out = {}
  if input then
    out[1] = 'lbs-input'
    out[2] = input
  end
else
  for j = 1, set_n do
    local k, v = ARGV[22 + 2 * j], ARGV[23 + 2 * j]
    if k ~= nil and v ~= nil then
      out[#out + 1] = k
      out[#out + 1] = v
    end
  end
end
out[#out + 1] = retry_field
out[#out + 1] = tostring(retries)
out[#out + 1] = original_field
out[#out + 1] = original
if #kept > 0 and not oversized then
  out[#out + 1] = deaths_field
  out[#out + 1] = table.concat(kept, ' ')
end
local max = tonumber(ARGV[6])
-- A key's registration (field lbs-keyed, see publish-1.lua) is never dead-lettered for its retries:
-- its retries are counted per message, in the key's state, and a poison message goes alone.
local dead = oversized or ARGV[11] == '1' or (max >= 0 and retries > max and not keyed)
local reason = ARGV[9]
if oversized then
  local why = 'entry has ' .. (#fields / 2) .. ' fields, too many to copy; kept in ' .. KEYS[1]
              .. ' as ' .. ARGV[2]
  reason = (reason and reason ~= '') and (why .. '; ' .. reason) or why
end
local delay = 0
if not dead and tonumber(ARGV[14]) > 0 then
  local d = math.min(tonumber(ARGV[14]) * 2 ^ math.max(retries - 1, 0), tonumber(ARGV[15]))
  delay = math.floor(d * tonumber(ARGV[16]))
end
local bad
if dead and ARGV[12] == '1' then
  bad = misfit(KEYS[2], 'stream', 'a stream')
elseif delay > 0 then
  bad = misfit(KEYS[4], 'stream', 'a stream') or misfit(KEYS[5], 'zset', 'the due index')
end
if bad then return {-2, bad} end

-- 5. Writes: add, then ack, delete, release (the name, our Go-style lock).
local code, id
if dead then
  if ARGV[12] == '1' then
    out[#out + 1] = ARGV[13] .. 'reason'
    out[#out + 1] = reason
    out[#out + 1] = ARGV[13] .. 'consumer'
    out[#out + 1] = ARGV[10]
    out[#out + 1] = ARGV[13] .. 'failed_id'
    out[#out + 1] = ARGV[2]
    if traced then
      out[#out + 1] = ARGV[13] .. 'traceback'
      out[#out + 1] = ARGV[20]
    end
    id = redis.call('XADD', KEYS[2], '*', unpack(out))
    code = 2
  else
    id = ''
    code = 3
  end
elseif delay > 0 then
  id = redis.call('XADD', KEYS[4], '*', unpack(out))
  local at = tonumber(string.match(id, '^(%d+)-'))
  redis.call('ZADD', KEYS[5], string.format('%.0f', at + delay), id)
  code = 4
else
  id = redis.call('XADD', KEYS[1], '*', unpack(out))
  code = 1
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if not oversized then
  redis.call('XDEL', KEYS[1], ARGV[2])
end
release()
unqueue()
for d in pairs(used) do redis.pcall('ZREM', KEYS[6], d) end
if name and ARGV[21] and ARGV[21] ~= '' then
  name_release(ARGV[21], KEYS[1], name, ARGV[2], (time_ms()))
end
if code == 4 then return {code, id, input or '', retries, delay} end
return {code, id, input or '', retries}
