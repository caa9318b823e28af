--[[
  The Go-style locks an lbs consumer holds beside its own (Config.go_compatible),
  so that consumers of the Go reference client v0.4 on the same service see
  lbs's work as held, and recover it through their keyspace listener when
  the lbs consumer dies (the lock expires: StreamExpired, then Claim).

  KEYS[1..n]  Go-style lock keys, "<DataStreamName><MUTEX_KEY_SEP><entry id>"
              (no hash tag: single Redis only, as the Go client is)

  ARGV[1]  the value: this consumer's name, as a Go consumer writes its own
  ARGV[2]  "keep": set each lock to ARGV[1] for ARGV[3] ms when it is absent
           or already ours; "release": delete each lock that holds ARGV[1]
  ARGV[3]  the TTL in ms ("keep")

  Checked before any write: every lock is a string or absent. A lock that
  holds another value (a Go consumer took the entry) or another type is
  left alone and reported.

  Output: the 1-based positions of the keys that hold something else.

  Events: del on the locks released; expired when a kept lock runs out.
]]
local name, mode = ARGV[1], ARGV[2]
local ttl = ARGV[3]
if mode ~= 'keep' and mode ~= 'release' then
  return redis.error_reply('ERR lbs golocks-n: mode (ARGV[2]) must be keep or release, got ' .. tostring(mode))
end
if mode == 'keep' and not (ttl and string.match(ttl, '^[1-9]%d*$')) then
  return redis.error_reply('ERR lbs golocks-n: TTL (ARGV[3]) must be an integer >= 1 (ms)')
end
local ours, others = {}, {}
for i, key in ipairs(KEYS) do
  local v = redis.pcall('GET', key)
  if type(v) == 'table' or (v and v ~= name) then
    others[#others + 1] = i
  else
    ours[#ours + 1] = {key, v}
  end
end
for _, kv in ipairs(ours) do
  if mode == 'keep' then
    redis.call('SET', kv[1], name, 'PX', ttl)
  elseif kv[2] then
    redis.call('DEL', kv[1])
  end
end
return others
