--[[
  Heartbeat: extend this consumer's lease and move its deadline, one key
  whatever it holds; beside a Go fleet, also keep a Go-style lock per held
  entry and refresh those entries' pending idle time.

  KEYS[1]        the load-balancer stream, <service>-input
  KEYS[2]        the consumer deadline index, {<service>-input}:deadlines
  KEYS[3]        this consumer's lease, {<service>-input}:lease:<consumer id>

  ARGV[1]        lease TTL in milliseconds, an integer >= 1
  ARGV[2]        consumer group
  ARGV[3]        consumer name in the group
  ARGV[4]        the lease's value: the process's nonce, "<nonce>.<n>" at its n-th take
  Beside a Go reference client v0.4 fleet (Config.go_compatible) 5 + 2n
  arguments follow:
  ARGV[5]        the Go-style locks' TTL in milliseconds, an integer >= 1
  ARGV[6..n+5]   the held entries' ids
  ARGV[n+6..2n+5] each entry's Go-style lock key, "<DataStreamName>
                 <MUTEX_KEY_SEP><entry id>" (no hash tag: single Redis
                 only, as the Go client is); its value is our consumer name
                 (ARGV[3]), as a Go consumer's is its own.

  A wrong argument count, an empty lease value or a bad TTL is an
  "ERR lbs extend-n: ..." error, with nothing written.

  Everything is read first, then written, and every write is guarded by
  what was read, so no key can make the script stop part-way:
    * the lease: holding ARGV[4], PEXPIRE ttl; absent or holding anything
      else, nothing at all is written and the output is the one note
      "LEASE <what it holds>" ("LEASE " when it does not exist, "LEASE
      WRONGTYPE <type>" for a key of another type): every entry read under
      it may already be someone else's;
    * the deadline index, if it does not exist or is a sorted set:
      ZADD <now + ttl> <consumer>; another type: not touched, reported;
    * beside a Go fleet: a Go-style lock that is absent or ours is set to
      our name for the Go TTL, and the entries behind them are refreshed
      (XCLAIM ... 0 ... JUSTID to ourselves resets the idle time without
      bumping the delivery counter, so a Go consumer's XAUTOCLAIM does not
      take live work); one holding anything else means a Go consumer took
      the entry: it is reported (its negative position) and not refreshed.

  Output: the negative 1-based positions (integers) of the entries a Go
  consumer took (beside a Go fleet), followed by zero or more notes:
    "LEASE <what the lease key holds>" (alone: the lease is lost)
    "LBSKEY <KEYS[2]> holds a <type>, not the consumer deadline index"

  One deadline per consumer: a consumer that stops heartbeating is found
  by recovery's deadline poller (reap-3.lua) once its deadline passes and
  its lease is gone.

  Events: none besides the keys it writes.
]]
--#include _checks
--#include _time
local go = #ARGV > 4
local n = go and (#ARGV - 5) / 2 or 0
if #KEYS ~= 3 or (#ARGV ~= 4 and (#ARGV < 5 or n ~= math.floor(n))) then
  return redis.error_reply('ERR lbs extend-n: expected 3 keys and 4 (5 + 2n beside a Go fleet) arguments, got '
                           .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local function is_ttl(v) return v and #v <= 15 and string.match(v, '^[1-9]%d*$') end
local ttl = ARGV[1]
if not is_ttl(ttl) then
  return redis.error_reply('ERR lbs extend-n: lease TTL (ARGV[1]) must be an integer >= 1 (ms)')
end
if ARGV[4] == '' then
  return redis.error_reply('ERR lbs extend-n: the lease value (ARGV[4]) must not be empty')
end
local go_ttl = go and ARGV[5]
if go and not is_ttl(go_ttl) then
  return redis.error_reply('ERR lbs extend-n: Go-style lock TTL (ARGV[5]) must be an integer >= 1 (ms)')
end
local lease = redis.pcall('GET', KEYS[3])
if type(lease) == 'table' then
  return {'LEASE WRONGTYPE ' .. redis.call('TYPE', KEYS[3])['ok']}
elseif lease ~= ARGV[4] then
  return {'LEASE ' .. (lease or '')}
end
local me, slice = ARGV[3], 500
local out, notes = {}, {}
local bad = misfit(KEYS[2], 'zset', 'the consumer deadline index')
if bad then notes[#notes + 1] = bad end
-- Beside a Go fleet: which Go-style locks are ours to keep (GET through pcall: a key of another
-- type is a table, someone else's).
local keep, claims, claim = {}, {}, nil
for i = 1, n do
  local g = redis.pcall('GET', ARGV[n + 5 + i])
  if g and g ~= me then
    out[#out + 1] = -i
  else
    keep[#keep + 1] = ARGV[n + 5 + i]
    if not claim or #claim == 5 + slice then
      claim = {'XCLAIM', KEYS[1], ARGV[2], me, 0}
      claims[#claims + 1] = claim
    end
    claim[#claim + 1] = ARGV[5 + i]
  end
end

-- The deadline's time is read before the first write (TIME, like every call, may be denied).
local deadline = not bad and time_ms() + tonumber(ttl)

-- Writes.
redis.call('PEXPIRE', KEYS[3], ttl)
if deadline then
  redis.call('ZADD', KEYS[2], deadline, me)
end
for _, lock in ipairs(keep) do
  redis.call('SET', lock, me, 'PX', go_ttl)
end
for _, c in ipairs(claims) do
  c[#c + 1] = 'JUSTID'
  redis.pcall(unpack(c))
end
for _, note in ipairs(notes) do out[#out + 1] = note end
return out
