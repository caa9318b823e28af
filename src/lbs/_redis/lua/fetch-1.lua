--[[
  Start processing held keys: for each, make its LBS entry the key's holder
  (fenced by the lease it is held under) and say where the key stands. The messages
  are not returned here: every message up to the committed position is
  trimmed by the commit that moves it (commit-1.lua), so the caller reads
  the key's next messages with a plain "XRANGE <data stream> - + COUNT n"
  sent right behind this call, and uses the reply only for a key that is
  ours.

  KEYS[1]  the load-balancer stream, <service>-input

  ARGV[1]  the service's key prefix, "{<service>-input}:" (data stream
           "<prefix>k:<key>", state "<prefix>m:<key>", in KEYS[1]'s slot)
  ARGV[2]  the lease key prefix, "{<service>-input}:lease:"
  ARGV[3]  the caller's batch size (how many messages a hold may take)
  ARGV[4]  the consumer group
  then, per key: key, LBS entry id, our hold ("<token>:<consumer id>:
  <instance nonce>": the entry is ours while the lease ARGV[2] ..
  <consumer id> holds the nonce)

  The key's state is a hash: "pos" (the last committed message id; absent:
  none), "holder" (the LBS entry whose holder processes the key), "token"
  (that holder's fencing token), "who" (that holder's consumer id: where
  publish-1.lua sends wakes), "idle:<token>" (set by commit-1.lua "stay"
  while the hold of that token keeps the key drained, running nothing;
  deleted by the holder before it runs messages again), "lingers" (set and
  deleted with it: publish-1.lua wakes the holder only then), "reg" (the latest
  registration, see
  publish-1.lua), "tries" (holds that tried "pos" without committing past
  it, this one included: fetch adds one, see commit-1.lua), and while a
  failure is being isolated "fails", "unblamed" and "until" (commit-1.lua,
  Failures).

  A hold that ended without a commit saying so (its holder died, stalled
  past its lease TTL or was cut off: "holder" names an entry no longer held
  (not pending, or pending to a consumer whose lease is gone), or our own
  entry with another "token", held before under an earlier one: lbs's
  recovery re-queues under a new id, so only a move under the same id, by
  XCLAIM, leaves that) counts as a failed hold against the messages it was
  running, unless its "idle:<token>" says it ran none (it kept the key
  drained: messages published since were never its): while one message at
  a time is being tried ("until" or "fails"
  set) the dead holder had the head, whose
  "fails" grows by 1 + "unblamed"; otherwise it had up to ARGV[3] messages,
  which are taken apart like a failed batch ("until" the ARGV[3]-th message
  after the position, "unblamed" 1), or, when only one message is left, the
  head's "fails" grows by 1. The caller dead-letters the head when "fails"
  reached its limit.

  Per key, checked before its first write (a key that fails writes nothing;
  the others go on):
    * our lease holds our nonce, else code 2 (lost);
    * the state is a hash (or absent), else code 4 (wrong type: "<key
      name> holds a <type>"; the data stream is the caller's XRANGE's);
    * "holder" is absent, ours, or an entry no longer held (a dead
      holder), else code 3 (a second registration of a key someone holds:
      the caller finishes this entry without processing it).

  Output: one reply per key, in order:
    {1, tries, pos, fails, unblamed, until}   ours ("until": "" for none)
    {2}                        hold lost
    {3, holder}                another live holder
    {4, what}                  a key of the wrong type

  Events: none besides the keys it writes.
]]
--#include _acl
--#include _keyed
local prefix, leases, batch, group = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if (#ARGV - 4) % 3 ~= 0 or not batch or batch < 1 or batch ~= math.floor(batch) then
  return redis.error_reply('ERR lbs fetch-1: expected 4 arguments (the batch an integer >= 1), then 3 per key')
end
local match = string.match
-- The ACL allows every command this script may call on these keys (checked before any write).
if #ARGV >= 7 then
  local state, lease = prefix .. 'm:' .. ARGV[5], leases .. 'x'
  local err = refused_by_acl('fetch-1', {{'GET', lease}, {'HMGET', state, 'holder'}, {'TYPE', state},
                                          {'EXISTS', lease}, {'XPENDING', KEYS[1], group, '0-1', '0-1', '1'},
                                          {'HSET', state, 'holder', 'v'}, {'HEXISTS', state, 'f'},
                                          {'HDEL', state, 'f'},
                                          {'XRANGE', prefix .. 'k:' .. ARGV[5], '-', '+'}})
  if err then return err end
end

local out = {}
for at = 5, #ARGV, 3 do
  local key, entry, value = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local state = prefix .. 'm:' .. key
  -- A state of another type than hash is an error reply here, before any write.
  local got = keyed_state(leases, value, state)
  if not got then
    out[#out + 1] = {2}
  elseif got.err then
    out[#out + 1] = {4, state .. ' holds a ' .. redis.call('TYPE', state)['ok']}
  else
    local holder, pos, tries = got[1], got[2] or '', got[3]
    local fails, unblamed, untl = got[4], got[5], got[6] or ''
    local token, who = match(value, '^(%d+):(.*):[^:]*$')
    token, who = token or '', who or ''
    -- The last hold's holder is gone: another entry's (its holder is checked next), or this entry's
    -- under an earlier token (held before under its id: that hold is gone).
    local other = holder and holder ~= entry
    local dead = other or (holder == entry and got[7] and got[7] ~= token)
    -- A dead holder that kept the key drained (commit-1.lua "stay") ran nothing: not a failed hold.
    local idle = dead and got[7] and 'idle:' .. got[7]
    if idle and redis.call('HEXISTS', state, idle) == 1 then
      dead = false
    else
      idle = nil
    end
    if other and keyed_alive(KEYS[1], group, leases, holder) then
      out[#out + 1] = {3, holder}
    elseif (pos ~= '' and not split_id(pos)) or (tries and not match(tries, '^%d+$'))
        or (fails and not match(fails, '^%d+$')) or (unblamed and not match(unblamed, '^[01]$'))
        or (untl ~= '' and not split_id(untl)) then
      out[#out + 1] = {4, state .. ' holds a pos, tries, fails, unblamed or until that is not one'}
    else
      fails, unblamed = tonumber(fails) or 0, tonumber(unblamed) or 0
      local rest = dead and keyed_after(prefix .. 'k:' .. key, pos, untl == '' and fails == 0 and batch or 1)
      if rest and rest.err then
        local data = prefix .. 'k:' .. key
        out[#out + 1] = {4, data .. ' holds a ' .. redis.call('TYPE', data)['ok']}
      else
        tries = (tonumber(tries) or 0) + 1
        if rest and #rest > 0 then
          -- The last hold ended with its holder: a failed hold (see the header).
          if untl ~= '' or fails > 0 or #rest == 1 then
            fails, unblamed = fails + 1 + unblamed, 0
          else
            untl, unblamed = rest[#rest][1], 1
          end
          redis.call('HSET', state, 'holder', entry, 'token', token, 'who', who, 'reg', entry,
                     'tries', tries, 'fails', fails, 'unblamed', unblamed, 'until', untl)
        else
          redis.call('HSET', state, 'holder', entry, 'token', token, 'who', who, 'reg', entry, 'tries', tries)
        end
        if idle then redis.call('HDEL', state, idle, 'lingers') end
        out[#out + 1] = {1, tries, pos, fails, unblamed, untl}
      end
    end
  end
end
return out
