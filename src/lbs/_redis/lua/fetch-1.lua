--[[
  Start processing held keys: for each, make its LBS entry the key's holder
  (fenced by the entry's lock) and say where the key stands. The messages
  are not returned here: every message up to the committed position is
  trimmed by the commit that moves it (commit-1.lua), so the caller reads
  the key's next messages with a plain "XRANGE <data stream> - + COUNT n"
  sent right behind this call, and uses the reply only for a key that is
  ours.

  KEYS[1]  the load-balancer stream, <service>-input

  ARGV[1]  the service's key prefix, "{<service>-input}:" (data stream
           "<prefix>k:<key>", state "<prefix>m:<key>", in KEYS[1]'s slot)
  ARGV[2]  the lock key prefix, "lock:{<service>-input}:"
  then, per key: key, LBS entry id, our lock value ("<token>:<owner>")

  The key's state is a hash: "pos" (the last committed message id; absent:
  none), "holder" (the LBS entry whose holder processes the key), "token"
  (that holder's fencing token), "reg" (the latest registration, see
  publish-1.lua), "tries" (holds that tried "pos" without committing past
  it, this one included: fetch adds one, see commit-1.lua).

  Per key, checked before its first write (a key that fails writes nothing;
  the others go on):
    * our lock holds our value, else code 2 (lost);
    * the state is a hash (or absent), else code 4 (wrong type: "<key
      name> holds a <type>"; the data stream is the caller's XRANGE's);
    * "holder" is absent, ours, or an entry whose lock is gone (a dead
      holder), else code 3 (a second registration of a key someone holds:
      the caller finishes this entry without processing it).

  Output: one reply per key, in order:
    {1, tries, pos}            ours
    {2}                        lock lost
    {3, holder}                another live holder
    {4, what}                  a key of the wrong type

  Events: none besides the keys it writes.
]]
local prefix, lock_prefix = ARGV[1], ARGV[2]
if (#ARGV - 2) % 3 ~= 0 then
  return redis.error_reply('ERR lbs fetch-1: expected 2 arguments, then 3 per key')
end
local function kind(key)
  return redis.call('TYPE', key)['ok']
end
-- Every command this script may call is allowed on these keys by the ACL:
-- checked before anything is written, so a missing one refuses the call
-- whole instead of stopping it half-way.
local function refused_by_acl(name, calls)
  for _, c in ipairs(calls) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM lbs ' .. name .. ': the ACL does not allow ' .. table.concat(c, ' '))
    end
  end
end
if #ARGV >= 5 then
  local state, lock = prefix .. 'm:' .. ARGV[3], lock_prefix .. ARGV[4]
  local err = refused_by_acl('fetch-1', {{'GET', lock}, {'HMGET', state, 'holder'}, {'TYPE', state},
                                          {'EXISTS', lock}, {'HSET', state, 'holder', 'v'}})
  if err then return err end
end

local out = {}
for at = 3, #ARGV, 3 do
  local key, entry, value = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local state = prefix .. 'm:' .. key
  local mine = redis.pcall('GET', lock_prefix .. entry)
  -- pcall: a state of another type than hash is an error here, before any write.
  local got = mine == value and redis.pcall('HMGET', state, 'holder', 'pos', 'tries')
  if mine ~= value then
    out[#out + 1] = {2}
  elseif got.err then
    out[#out + 1] = {4, state .. ' holds a ' .. kind(state)}
  else
    local holder, pos, tries = got[1], got[2] or '', got[3]
    if holder and holder ~= entry and redis.call('EXISTS', lock_prefix .. holder) == 1 then
      out[#out + 1] = {3, holder}
    elseif (pos ~= '' and not string.match(pos, '^%d+%-%d+$')) or (tries and not string.match(tries, '^%d+$')) then
      out[#out + 1] = {4, state .. ' holds a pos or tries that is not one'}
    else
      local token = string.match(value, '^(%d+):') or ''
      tries = (tonumber(tries) or 0) + 1
      redis.call('HSET', state, 'holder', entry, 'token', token, 'reg', entry, 'tries', tries)
      out[#out + 1] = {1, tries, pos}
    end
  end
end
return out
