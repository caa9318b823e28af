--[[
  Put assignments back into circulation as fresh entries, park them to come
  back after a retry delay, or put them into the dead-letter stream: each
  entry in one atomic step (there is no moment at which a crash loses it),
  up to a batch of entries in one call (a dead holder's 100,000 streams go
  back in calls of a hundred).

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

  ARGV[1]  the client's switches, packed once per client: a JSON array
             [1] consumer group
             [2] max retries: past it the entry is dead-lettered; -1 =
                 never (and never an entry with the field lbs-keyed: a
                 key's registration, publish-1.lua)
             [3] retry count field name (default "_retry_count")
             [4] original id field name (default "_original_id")
             [5] our consumer id (mode "owned"/"restart": the holder;
                 recorded in dead letters)
             [6] 1 when a dead-letter stream is configured; 0 drops instead
             [7] the managed-field prefix (default "_"): dead letters get
                 <prefix>reason, <prefix>consumer and <prefix>failed_id
             [8] beside a Go reference client v0.4 fleet
                 (Config.go_compatible): its lock key separator,
                 "<MUTEX_KEY_SEP>"; "" otherwise. In mode "absent" an entry
                 whose Go-style lock "<DataStreamName><sep><entry id>"
                 exists is held by a live Go consumer: nothing is touched
                 ({0, "go lock"}). The key is outside the service's slot:
                 single Redis only, as the Go client is.
             [9] the queued sets' prefix, {<service>-input}:queued: (""
                 none); the holder's set is this plus its consumer name
                 (from XPENDING; same slot, not declared). An entry in it
                 was merely held (see ARGV[4]); it leaves the set when the
                 entry is re-queued, parked, dead-lettered or found trimmed
             [10] the service's key prefix, {<service>-input}: ("": names
                 untouched; one holder per name, _names.lua; same slot,
                 keys not declared): once an entry is re-queued, parked or
                 dead-lettered (codes 1-4) it releases its DataStreamName
                 if it holds it, and the oldest registration waiting for
                 the name goes back into the LBS (after the copy)
             [11] beside a Go fleet in mode "absent": the least idle time
                 (ms) of an entry it re-queues (the client passes 1 s, or
                 the lease TTL when shorter; 0: not checked). The Go
                 client's Claim moves an entry (XCLAIM, idle reset to 0)
                 and takes its Go-style lock one round trip later; an entry
                 of a dead holder has been idle at least its lock's TTL. An
                 entry idle less was just claimed: nothing is touched
                 ({0, "claimed"})
  ARGV[2]  holder mode: "owned" (each entry must be pending to our consumer
           id and its lease KEYS[3] .. <id> hold ARGV[3]), "absent" (the
           lease of the consumer an entry is pending to must not exist: its
           holder is gone), "restart" (as "owned", for what an earlier
           process under our consumer id left: a death counts as in
           "absent"), "any" (not checked)
  ARGV[3]  our lease value, for modes "owned" and "restart"
  ARGV[4]  retry increment: "0" (hand-back on shutdown) or "1" (a failure).
           In mode "absent" (its holder is gone) a "1" counts only when the
           holder was running the entry: it does not count for an entry in
           the holder's queued set, which the holder merely held (queued for
           its application), and the client takes it out once the
           application takes it. A death counted so also appends the entry
           id to the copy's <prefix>deaths (space-separated, the latest 32
           kept): when a later call finds one of them in KEYS[6] it takes
           that retry back (and drops the id)
  ARGV[5]  "1" to dead-letter unconditionally (malformed entries)
  ARGV[6]  the failure's traceback, recorded in a dead letter as
           <prefix>traceback ("": no such field)
  ARGV[7]  retry delay (ms) at retry count 1: "0" re-queues at once;
           otherwise the copy is parked (KEYS[4], KEYS[5]) for
           d = min(ARGV[7] * 2^(n-1), ARGV[8]) * <jitter> ms, n the copy's
           retry count (at least 1), rounded down; a d of 0 re-queues at once
  ARGV[8]  longest retry delay (ms)
  ARGV[9]… the entries, each as
             entry id,
             reason (recorded in dead letters),
             jitter: a factor in [0.5, 1] (so d is uniform in [d/2, d] when
               the caller draws it uniformly; "1" for a fixed delay),
             mode "owned" beside a Go fleet: its DataStreamName, whose
               Go-style lock "<name><sep><entry id>" is released with ours
               ("" otherwise),
             n, how many fields the caller sets on its copy (a plugin's,
               e.g. the failed attempt's trace context), then their 2n
               names and values, each replacing the entry's own field of
               that name

  Order, per entry: every check comes before the first write, and the copy
  is added before the original is acked, so no state of Redis stops it
  part-way (the acks and deletes of the whole call are sent last, in one
  XACK and one XDEL):
    1. in modes "owned"/"restart" our lease, once per call (GET through
       pcall: a key of another type is nobody's lease we hold; when it does
       not hold ARGV[3] every entry is {0, "lock"}), then with a name our
       Go-style lock;
    2. pending? (XPENDING <LBS> <group> <id> <id> 1, read-only; no group
       or no stream: not pending; an id already handled earlier in the
       call: not pending). If not, nothing is touched; in modes "owned"/
       "restart" pending to another consumer, nothing is touched; in mode
       "absent" its holder's lease (EXISTS, once per holder per call; a key
       of another type counts as alive) must not exist;
    3. the entry (XRANGE). Gone: its pending reference is acked (and our
       Go-style lock released, mode "owned");
    4. the target: the LBS (re-queue), the parking stream and due index
       (park) or the dead-letter stream. The dead-letter stream and the
       parking stream must not exist or be streams, the due index must not
       exist or be a sorted set, else nothing is touched;
    5. XADD the copy (parked: XADD to KEYS[4], then ZADD its id to KEYS[5]
       at the time of its id's milliseconds + d, so the stored delay is
       exactly d), release the name, our Go-style lock; the XACK and XDEL
       of the original at the end of the call.

  Copies: the entry's fields (those the caller sets replaced), the retry
  count (+ the deaths counted while it was pending, its delivery count less
  one, + ARGV[4], less pardoned deaths; each pardon takes one back and is
  removed), the original id and <prefix>deaths when any (a parked copy too:
  it goes back into the LBS as it is); dead letters also get
  <prefix>reason, <prefix>consumer, <prefix>failed_id and, with ARGV[6],
  <prefix>traceback. A copy of more than 7,000 values (fields and values
  counted apart) cannot be passed through Lua's unpack: such an entry is
  dead-lettered whatever its retry count (never parked), with only
  lbs-input (if present), the retry count and original id fields,
  <prefix>reason = "entry has <N> fields, too many to copy; kept in <LBS
  key> as <id>" (followed by "; <reason>" when a reason was given),
  <prefix>consumer and <prefix>failed_id. It is acked but NOT deleted: the
  original, with all its fields, stays in the LBS as the record. Without a
  dead-letter stream (option [6] not 1) it is likewise acked, not deleted:
  code 3. Past max retries an entry is dead-lettered at once, whatever
  ARGV[7].

  Output: one reply per entry, in their order, each
    {1, new id, lbs-input, retry count}  re-queued as a fresh entry
    {2, dlq id, ...}       dead-lettered
    {3, "", ...}           dropped (dead letter wanted, no dead-letter stream)
    {4, parked id, ..., d} parked in KEYS[4] for d ms (due at the parked
                           id's milliseconds + d, in KEYS[5])
    {0, "lock"}            holder check failed: nothing touched (modes
                           "owned"/"restart": not pending to us under this
                           lease; "absent": its holder's lease lives)
    {0, "claimed"}         just claimed (idle less than option [11]):
                           nothing touched
    {0, "go lock"}         a Go consumer holds it: nothing touched
    {0, "acked"}           not pending (someone else already handled it)
    {-1, "trimmed"}        the entry is gone from the stream; its pending
                           reference was cleaned
    {-2, message}          a precondition failed, nothing touched; message:
                           "LBSKEY <key> holds a <type>, not a stream" (KEYS[2]
                           or KEYS[4]) or "LBSKEY <KEYS[5]> holds a <type>,
                           not the due index"
  A malformed call (entries cut short) is an error before anything is
  touched.

  Events: xadd on the LBS, the parking stream or the dead-letter stream;
  zadd on the due index; del on our Go-style lock; a released name's as in
  done-n.lua.
]]
--#include _checks
--#include _names
--#include _time
local MAX_COPY = 7000
local o = cjson.decode(ARGV[1])
local group, max, retry_field, original_field, me = o[1], tonumber(o[2]), o[3], o[4], o[5]
local dead_letter_on, prefix, go_sep, queued_prefix, key_prefix = o[6] == 1, o[7], o[8], o[9], o[10]
local min_idle = tonumber(o[11]) or 0
local mode, trace = ARGV[2], ARGV[6]
local traced = trace ~= ''
local first_ms, most_ms = tonumber(ARGV[7]), tonumber(ARGV[8])
local deaths_field = prefix .. 'deaths'
local go = go_sep ~= ''

-- The entries: their positions in ARGV, checked before anything is touched.
local at, starts = 9, {}
while at <= #ARGV do
  local n = tonumber(ARGV[at + 4])
  if n == nil or n < 0 or at + 4 + 2 * n > #ARGV then
    return redis.error_reply('ERR lbs requeue-6: entry ' .. (#starts + 1) .. ' is cut short')
  end
  starts[#starts + 1] = at
  at = at + 5 + 2 * n
end

-- 1. Our lease (modes "owned", "restart"), once for the call.
local ours = mode == 'owned' or mode == 'restart'
local lease_ok = not ours or redis.pcall('GET', KEYS[3] .. me) == ARGV[3]
local alive = {}  -- mode "absent": holder -> its lease exists
local handled = {}  -- ids acked by this call (their XACK comes at the end)
local acks, dels = {}, {}
local now

local function one(a)
  if not lease_ok then return {0, 'lock'} end
  local id, reason, jitter, name_arg, set_n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3], tonumber(ARGV[a + 4])
  local set = {}
  for j = 1, set_n do set[ARGV[a + 3 + 2 * j]] = true end
  -- Mode "owned" beside a Go fleet: our Go-style lock, released with the entry.
  local go_lock = mode == 'owned' and go and name_arg ~= '' and name_arg .. go_sep .. id
  if go_lock then
    local g = redis.pcall('GET', go_lock)
    if g and g ~= me then
      return {0, 'go lock'}
    elseif not g then
      go_lock = nil
    end
  end

  -- 2. Still pending, and to whom?
  if handled[id] then return {0, 'acked'} end
  local p = redis.pcall('XPENDING', KEYS[1], group, id, id, 1)
  if type(p) ~= 'table' or not p[1] then
    return {0, 'acked'}
  end
  local holder = p[1][2]
  if ours and holder ~= me then
    return {0, 'lock'}
  elseif mode == 'absent' then
    if alive[holder] == nil then alive[holder] = redis.call('EXISTS', KEYS[3] .. holder) == 1 end
    if alive[holder] then return {0, 'lock'} end
    -- Beside a Go fleet: not just claimed (the Go client's Claim is two steps)?
    if go and min_idle > 0 and tonumber(p[1][3]) < min_idle then
      return {0, 'claimed'}
    end
  end

  -- Merely held by its holder (queued for its application, never taken)?
  local qkey = queued_prefix ~= '' and (queued_prefix .. holder) or nil
  local queued = qkey ~= nil and redis.pcall('SISMEMBER', qkey, id) == 1
  local function done_with(delete)
    handled[id] = true
    acks[#acks + 1] = id
    if delete then dels[#dels + 1] = id end
    if go_lock then redis.call('DEL', go_lock) end
    if queued then redis.pcall('SREM', qkey, id) end
  end

  -- 3. The entry.
  local found = redis.call('XRANGE', KEYS[1], id, id)
  if #found == 0 then
    done_with(false)
    return {-1, 'trimmed'}
  end
  local fields = found[1][2]
  -- A dead holder's death counts only against what it was running, not what it merely held (ARGV[4]).
  local increment = tonumber(ARGV[4])
  local died = (mode == 'absent' or mode == 'restart') and increment > 0
  if died and queued then
    increment, died = 0, false
  end
  -- 3b. Beside a Go fleet: a live Go holder's lock (its key needs the data stream's name).
  local name = name_of(fields)
  if mode == 'absent' and go and name and redis.call('EXISTS', name .. go_sep .. id) == 1 then
    return {0, 'go lock'}
  end

  -- 4. The copy and its target.
  local out = {}
  local retries = 0
  local original = id
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
    elseif not set[k] then
      out[#out + 1] = k
      out[#out + 1] = v
    end
  end
  -- Deaths counted while the entry was pending: its delivery count less one (an XCLAIM or XREADGROUP
  -- CLAIM that moved it under its id counted one there; lbs's own recovery does not), carried into
  -- the copy like those of earlier copies.
  local before = math.min(math.max(tonumber(p[1][4]) - 1, 0), 32)
  retries = retries + before
  local counted = {}
  if deaths then
    for d in string.gmatch(deaths, '%S+') do counted[#counted + 1] = d end
  end
  for _ = 1, before do counted[#counted + 1] = id end
  -- Deaths counted while the holder in fact lived (it pardoned them since): taken back, one per
  -- pardon (the pardons used are removed with the writes, below).
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
  if died then kept[#kept + 1] = id end
  while #kept > 32 do table.remove(kept, 1) end
  retries = retries + increment
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
      out[#out + 1] = ARGV[a + 3 + 2 * j]
      out[#out + 1] = ARGV[a + 4 + 2 * j]
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
  -- A key's registration (field lbs-keyed, see publish-1.lua) is never dead-lettered for its retries:
  -- its retries are counted per message, in the key's state, and a poison message goes alone.
  local dead = oversized or ARGV[5] == '1' or (max >= 0 and retries > max and not keyed)
  if oversized then
    local why = 'entry has ' .. (#fields / 2) .. ' fields, too many to copy; kept in ' .. KEYS[1]
                .. ' as ' .. id
    reason = (reason ~= '') and (why .. '; ' .. reason) or why
  end
  local delay = 0
  if not dead and first_ms > 0 then
    delay = math.floor(math.min(first_ms * 2 ^ math.max(retries - 1, 0), most_ms) * jitter)
  end
  local bad
  if dead and dead_letter_on then
    bad = misfit(KEYS[2], 'stream', 'a stream')
  elseif delay > 0 then
    bad = misfit(KEYS[4], 'stream', 'a stream') or misfit(KEYS[5], 'zset', 'the due index')
  end
  if bad then return {-2, bad} end

  -- 5. Writes: add, then release (the name, our Go-style lock); the ack and delete at the call's end.
  local code, new
  if dead then
    if dead_letter_on then
      out[#out + 1] = prefix .. 'reason'
      out[#out + 1] = reason
      out[#out + 1] = prefix .. 'consumer'
      out[#out + 1] = me
      out[#out + 1] = prefix .. 'failed_id'
      out[#out + 1] = id
      if traced then
        out[#out + 1] = prefix .. 'traceback'
        out[#out + 1] = trace
      end
      new = redis.call('XADD', KEYS[2], '*', unpack(out))
      code = 2
    else
      new = ''
      code = 3
    end
  elseif delay > 0 then
    new = redis.call('XADD', KEYS[4], '*', unpack(out))
    redis.call('ZADD', KEYS[5], string.format('%.0f', tonumber(string.match(new, '^(%d+)-')) + delay), new)
    code = 4
  else
    new = redis.call('XADD', KEYS[1], '*', unpack(out))
    code = 1
  end
  done_with(not oversized)
  for d in pairs(used) do redis.pcall('ZREM', KEYS[6], d) end
  if name and key_prefix ~= '' then
    now = now or time_ms()
    name_release(key_prefix, KEYS[1], name, id, now)
  end
  if code == 4 then return {code, new, input or '', retries, delay} end
  return {code, new, input or '', retries}
end

local replies = {}
for i, a in ipairs(starts) do replies[i] = one(a) end
if #acks > 0 then redis.call('XACK', KEYS[1], group, unpack(acks)) end
if #dels > 0 then redis.call('XDEL', KEYS[1], unpack(dels)) end
return replies
