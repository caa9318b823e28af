--[[
  Put an assignment back into circulation as a fresh entry, or into the
  dead-letter stream, in one atomic step: there is no moment at which a
  crash loses it.

  KEYS[1]  the load-balancer stream, <service>-input
  KEYS[2]  the dead-letter stream, {<service>-input}:dlq
  KEYS[3]  the assignment's lock key

  ARGV[1]   consumer group
  ARGV[2]   entry id
  ARGV[3]   lock mode: "owned" (the lock must hold ARGV[4]; it is released),
            "absent" (the lock must not exist), "any" (not checked)
  ARGV[4]   our lock value, for mode "owned"
  ARGV[5]   retry increment: "0" (hand-back on shutdown) or "1" (a failure)
  ARGV[6]   max retries: past it the entry is dead-lettered; "-1" = never
  ARGV[7]   retry count field name (default "_retry_count")
  ARGV[8]   original id field name (default "_original_id")
  ARGV[9]   reason, recorded in dead letters
  ARGV[10]  consumer id, recorded in dead letters
  ARGV[11]  "1" to dead-letter unconditionally (malformed entries)
  ARGV[12]  "1" when a dead-letter stream is configured; "0" drops instead
  ARGV[13]  the managed-field prefix (default "_"): dead letters get
            <prefix>reason, <prefix>consumer and <prefix>failed_id

  Output: {code, detail, lbs-input, retry count}
    {1, new id, ...}       re-queued as a fresh entry
    {2, dlq id, ...}       dead-lettered
    {3, "", ...}           dropped (dead letter wanted, no dead-letter stream)
    {0, "lock"}            lock check failed: nothing touched
    {0, "acked"}           not pending (someone else already handled it)
    {-1, "trimmed"}        the entry is gone from the stream; its pending
                           reference was cleaned and its lock released

  Events: xadd on the LBS or the dead-letter stream; del on the lock key.
]]
local mode = ARGV[3]
local holder = redis.call('GET', KEYS[3])
if mode == 'owned' and holder ~= ARGV[4] then
  return {0, 'lock'}
elseif mode == 'absent' and holder then
  return {0, 'lock'}
end
local acked = redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked ~= 1 then
  if mode == 'owned' then redis.call('DEL', KEYS[3]) end
  return {0, 'acked'}
end
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found == 0 then
  if mode == 'owned' then redis.call('DEL', KEYS[3]) end
  return {-1, 'trimmed'}
end
local fields = found[1][2]
local retry_field, original_field = ARGV[7], ARGV[8]
local out = {}
local retries = 0
local original = ARGV[2]
local input = ''
for i = 1, #fields, 2 do
  local k, v = fields[i], fields[i + 1]
  if k == 'lbs-input' then input = v end
  if k == retry_field then
    retries = tonumber(v) or 0
  elseif k == original_field then
    original = v
  else
    out[#out + 1] = k
    out[#out + 1] = v
  end
end
retries = retries + tonumber(ARGV[5])
out[#out + 1] = retry_field
out[#out + 1] = tostring(retries)
out[#out + 1] = original_field
out[#out + 1] = original
local max = tonumber(ARGV[6])
local code, id
if ARGV[11] == '1' or (max >= 0 and retries > max) then
  if ARGV[12] == '1' then
    out[#out + 1] = ARGV[13] .. 'reason'
    out[#out + 1] = ARGV[9]
    out[#out + 1] = ARGV[13] .. 'consumer'
    out[#out + 1] = ARGV[10]
    out[#out + 1] = ARGV[13] .. 'failed_id'
    out[#out + 1] = ARGV[2]
    id = redis.call('XADD', KEYS[2], '*', unpack(out))
    code = 2
  else
    id = ''
    code = 3
  end
else
  id = redis.call('XADD', KEYS[1], '*', unpack(out))
  code = 1
end
redis.call('XDEL', KEYS[1], ARGV[2])
if mode == 'owned' then redis.call('DEL', KEYS[3]) end
return {code, id, input, retries}
