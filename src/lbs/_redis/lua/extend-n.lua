--[[
  Heartbeat: extend every lock still holding our value, refresh the
  pending-list idle time of the entries behind them, and (last call of a
  tick) this consumer's deadline and instance marker.

  KEYS[1]        the load-balancer stream, <service>-input
  KEYS[2]        the consumer deadline index, {<service>-input}:consumers
  KEYS[3]        this consumer's instance marker,
                 {<service>-input}:instance:<consumer id>
  KEYS[4..n+3]   lock keys (n may be 0: a tick with no held locks still
                 refreshes the instance marker)

  ARGV[1]        lock TTL in milliseconds, an integer >= 1
  ARGV[2]        consumer group
  ARGV[3]        consumer name in the group
  ARGV[4]        "1" in the last call of a tick: move this consumer's
                 deadline and refresh its instance marker; "0" in the others
  ARGV[5]        this process's instance nonce (not empty)
  ARGV[6..n+5]   the lock values we set ("<token>:<owner>"), one per key
  ARGV[n+6]      one flag per key, "1" to refresh that entry's pending idle
                 time this call, "0" to leave it; "": all. Say m flags are
                 "1" (m = n for "")
  ARGV[n+7..n+m+6] the entry ids behind the flagged locks, in key order
                 (only those: an id nobody refreshes is not sent)
  Beside a Go reference client v0.4 fleet (Config.go_compatible), 2n + m
  + 7 arguments: after the ids
  ARGV[n+m+7]    the Go-style locks' TTL in milliseconds, an integer >= 1
  ARGV[n+m+8..2n+m+7] each key's Go-style lock key, "<DataStreamName>
                 <MUTEX_KEY_SEP><entry id>" (no hash tag: single Redis
                 only, as the Go client is); its value is our consumer name
                 (ARGV[3]), as a Go consumer's is its own.

  A wrong argument count, flags that are neither "" nor one character per
  key, an empty nonce or a bad TTL is an "ERR lbs extend-n: ..." error,
  with nothing written.

  Everything is read first (the locks with one MGET per slice of 500, so a
  key of another type reads as nil; each Go-style lock and the marker with
  GET through pcall; TYPE of the index), then written, and every write is
  guarded by what was read, so no key can make the script stop part-way:
    * a lock holding our value gets PEXPIRE ttl; any other value, no key,
      or a key of another type is lost (reported, not touched);
    * beside a Go fleet, where our lock holds our value: a Go-style lock
      that is absent or ours is set to our name for the Go TTL, and the
      entry's idle time refreshed as flagged; one holding anything else
      means a Go consumer took the entry: our lock is deleted, the entry
      not refreshed (so not pulled back from the Go holder), and the
      position reported negative. Where our lock is lost, a Go-style lock
      holding our name is deleted (so recovery need not wait for it);
    * only when ARGV[4] is "1":
        - the deadline index, if it does not exist or is a sorted set:
          ZADD <now + ttl> <consumer>, but only when n > 0 or the consumer
          is already in it (one holding nothing does not add itself);
          another type: not touched, reported;
        - the instance marker: absent or holding ARGV[5]: SET ARGV[5] PX
          ttl; holding another nonce: left alone, reported (another live
          process runs with the same consumer id); another type: not
          touched, reported.

  Output: the 1-based positions (integers) of the locks that are no longer
  ours (expired, taken by someone else, or not a string), negative for
  those a Go consumer took (beside a Go fleet), followed, only
  in a last call, by zero or more strings:
    "LBSKEY <KEYS[2]> holds a <type>, not the consumer deadline index"
    "INSTANCE <the other nonce>"
    "LBSKEY <KEYS[3]> holds a <type>, not an instance marker"

  One deadline per consumer, not per lock: a tick's calls run in order, so
  when its last call moves the deadline every lock of the tick has been
  extended, and the deadline is at most one tick's duration after the
  earliest of them expires. A consumer that stops heartbeating is found by
  recovery's deadline poller (reap-4.lua); one that lives finds its own
  lost locks in this output.

  XCLAIM ... 0 ... JUSTID to ourselves resets the idle time without bumping
  the delivery counter, so live work never looks idle to an XPENDING IDLE
  scan or to XREADGROUP CLAIM. The client flags a rotating share of the
  entries per call, so each is refreshed well within the scan's min-idle
  without paying for every entry on every tick. Slices of 500 ids stay
  clear of Lua's unpack limit. Errors from XCLAIM (NOGROUP after the group
  vanished) are ignored here: the reader recreates the group.

  Events: none besides the keys it writes (del on the locks it deletes).
]]
--#include _checks
--#include _time
local n = #KEYS - 3
local flags = n >= 0 and ARGV[n + 6]
if not flags or (flags ~= '' and #flags ~= n) then
  return redis.error_reply('ERR lbs extend-n: expected 3 + n keys and the refresh flags (ARGV[n+6]) "" or '
                           .. 'one per key, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local all = flags == ''
-- m: how many ids follow the flags (one per "1").
local m = all and n or select(2, string.gsub(flags, '1', ''))
local go = #ARGV == 2 * n + m + 7
if #ARGV ~= n + m + 6 and not go then
  return redis.error_reply('ERR lbs extend-n: expected 3 + n keys and n + m + 6 or 2n + m + 7 arguments (m '
                           .. 'flagged ids), got ' .. #KEYS .. ' keys, ' .. m .. ' flagged and ' .. #ARGV
                           .. ' arguments')
end
if ARGV[5] == '' then
  return redis.error_reply('ERR lbs extend-n: the instance nonce (ARGV[5]) must not be empty')
end
local function is_ttl(v) return v and #v <= 15 and string.match(v, '^[1-9]%d*$') end
local ttl = ARGV[1]
if not is_ttl(ttl) then
  return redis.error_reply('ERR lbs extend-n: lock TTL (ARGV[1]) must be an integer >= 1 (ms)')
end
-- The Go-style lock keys are ARGV[G + i].
local G = n + m + 7
local go_ttl = go and ARGV[G]
if go and not is_ttl(go_ttl) then
  return redis.error_reply('ERR lbs extend-n: Go-style lock TTL (ARGV[n+m+7]) must be an integer >= 1 (ms)')
end
local byte, min = string.byte, math.min
local last = ARGV[4] == '1'
local nonce = ARGV[5]
local me = ARGV[3]
local slice = 500

-- Reads: the locks with one MGET per slice of 500 (a key of another type reads as nil: lost). What is ours is listed by position (mine); the entries to
-- refresh go straight into their XCLAIM calls, one per 500 ids.
local out, nout, mine, nmine = {}, 0, {}, 0
local claims, claim, nclaim = {}, nil, 0
local id = n + 6  -- the last flagged entry's id: ARGV[id]
local go_keep, go_dels, taken = {}, {}, {}
for s = 1, n, slice do
  local e = min(s + slice - 1, n)
  local v = redis.call('MGET', unpack(KEYS, s + 3, e + 3))
  for i = s, e do
    -- Beside a Go fleet: its Go-style lock (GET through pcall: a key of another type is a table,
    -- someone else's).
    local g = go and redis.pcall('GET', ARGV[G + i])
    local flagged = all or byte(flags, i) == 49
    if flagged then id = id + 1 end
    if v[i - s + 1] == ARGV[i + 5] then
      if g and g ~= me then  -- a Go consumer took it
        taken[#taken + 1] = KEYS[i + 3]
        nout = nout + 1
        out[nout] = -i
      else
        nmine = nmine + 1
        mine[nmine] = i
        if go then go_keep[#go_keep + 1] = ARGV[G + i] end
        if flagged then
          if nclaim == 0 then
            claim = {'XCLAIM', KEYS[1], ARGV[2], me, 0}
            claims[#claims + 1] = claim
          end
          nclaim = nclaim + 1
          claim[5 + nclaim] = ARGV[id]
          if nclaim == slice then nclaim = 0 end
        end
      end
    else
      nout = nout + 1
      out[nout] = i
      if g == me then go_dels[#go_dels + 1] = ARGV[G + i] end
    end
  end
end
local notes = {}
local zadd, set_marker = false, false
if last then
  local bad = misfit(KEYS[2], 'zset', 'the consumer deadline index')
  if bad then
    notes[#notes + 1] = bad
  else
    zadd = n > 0 or redis.call('ZSCORE', KEYS[2], ARGV[3]) ~= false
  end
  local marker = redis.pcall('GET', KEYS[3])
  if type(marker) == 'table' then
    notes[#notes + 1] = 'LBSKEY ' .. KEYS[3] .. ' holds a ' .. redis.call('TYPE', KEYS[3])['ok']
                        .. ', not an instance marker'
  elseif not marker or marker == nonce then
    set_marker = true
  else
    notes[#notes + 1] = 'INSTANCE ' .. marker
  end
end

-- Writes.
for j = 1, nmine do
  redis.call('PEXPIRE', KEYS[mine[j] + 3], ttl)
end
for _, lock in ipairs(go_keep) do
  redis.call('SET', lock, me, 'PX', go_ttl)
end
for s = 1, #taken, slice do
  redis.call('DEL', unpack(taken, s, min(s + slice - 1, #taken)))
end
for s = 1, #go_dels, slice do
  redis.call('DEL', unpack(go_dels, s, min(s + slice - 1, #go_dels)))
end
if zadd then
  redis.call('ZADD', KEYS[2], time_ms() + tonumber(ttl), ARGV[3])
end
if set_marker then
  redis.call('SET', KEYS[3], nonce, 'PX', ttl)
end
for _, c in ipairs(claims) do
  c[#c + 1] = 'JUSTID'
  redis.pcall(unpack(c))
end
for _, note in ipairs(notes) do
  nout = nout + 1
  out[nout] = note
end
return out
