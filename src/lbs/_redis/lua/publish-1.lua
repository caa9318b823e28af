--[[
  Publish messages by key: append each to its key's data stream and register
  every key that nobody holds or has queued in the load-balancer stream, in
  one atomic call (so a holder finishing at the same moment either sees the
  new message before it lets go, or has let go and the key is registered
  again here: nothing is stranded).

  KEYS[1]  the load-balancer stream, <service>-input

  ARGV[1]  the service's key prefix, "{<service>-input}:" (KEYS[1]'s hash tag:
           a key's data stream "<prefix>k:<key>" and its state
           "<prefix>m:<key>" live in the LBS's slot)
  ARGV[2]  the number of messages, m >= 1
  then, per message, in order:
           key, registration, field count f (even, >= 2), f fields
           registration: the LBS entry's lbs-input value for the key (JSON
           {"DataStreamName": key, "Info": {}}), sent with the key's first
           message in the call, "" with the others

  A registration parked for a retry delay (in "<prefix>delayed", see
  commit-1.lua) is in force too. A registration is an LBS entry with fields lbs-input (the JSON above) and
  lbs-keyed = "1": requeue-6.lua never dead-letters one for its retries (a
  key counts its failures per message). A key is registered when its
  state's "reg" names no entry of the LBS (none
  yet, or the entry was finished, dead-lettered or lost): an entry that is
  still in the LBS, waiting or pending, is a registration in force. A
  re-queue copies the entry under a new id, so "reg" can lag behind: the key
  is then registered twice, which fetch-1.lua resolves (a second copy finds
  a live holder and is finished unprocessed).

  Message ids of a key only grow, across let-go: commit-1.lua deletes a
  drained key's data stream, and a stream created again would start at
  "<now ms>-0", the same id as (or below) the last one of the stream it
  replaces when both fall in one millisecond (or below it, after the
  server's clock went back). So commit-1.lua keeps the highest millisecond
  of the last ids of the data streams it deleted in the sorted set
  "<prefix>idfloor" (member "ms"), and the first message of a data stream
  this call creates gets the explicit id "<max(now ms, floor + 1)>-0"
  (server time, TIME); later messages of the stream are "*" (Redis makes
  them larger).

  Preconditions, checked before the first write; a violation writes nothing
  and returns "LBSKEY <key name> <what is wrong>":
    * KEYS[1] does not exist or is a stream;
    * each data stream does not exist or is a stream, each state a hash;
    * when a data stream is created, "<prefix>idfloor" does not exist or
      is a sorted set.
  Malformed ARGV gives "ERR lbs publish-1: ..." (nothing written).

  Output: {ids, registered}
    ids         the message ids, in order
    registered  how many keys this call registered

  A held key's registration is in force without a look in the LBS: its
  state's "holder" (fetch-1.lua) is its "reg", an entry pending to the
  holder until a commit lets the key go (deleting the state, or moving
  "reg" and deleting "holder", atomically with the entry) or recovery
  re-queues it under a new id (the copy is a registration in force: it
  leads to the key, whose next fetch-1.lua sets both again).

  A key whose registration is in force and whose holder keeps it drained
  (its state's "lingers", set by commit-1.lua "stay"; "who" names the
  holding consumer, written by fetch-1.lua) gets a wake: one SPUBLISH
  "<prefix>wake:<who>" per consumer per call, its message the JSON array
  of that consumer's keys woken (each once). A key being processed gets
  none: its holder's next commit reads what came. A wake lost is a
  latency, never a loss (the holder lets the key go with a commit that
  returns what came).

  The appending, registering and waking are _publish.lua's, shared with
  promote-4.lua, which publishes a delayed call (lbs.Publisher's delay= or
  at=, parked in "<prefix>delayed") as this script would, when it is due.

  Events: none besides the keys it writes and the wakes.
]]
--#include _acl
--#include _checks
--#include _time
--#include _publish

local prefix, m = ARGV[1], tonumber(ARGV[2])
if not m or m < 1 or m ~= math.floor(m) then
  return redis.error_reply('ERR lbs publish-1: the message count (ARGV[2]) must be an integer >= 1')
end
-- The ACL allows every command this script may call on these keys (checked before any write).
do
  local data, state = prefix .. 'k:' .. (ARGV[3] or ''), prefix .. 'm:' .. (ARGV[3] or '')
  local err = refused_by_acl('publish-1', {
    {'TYPE', KEYS[1]}, {'TYPE', data}, {'TYPE', state}, {'XADD', data, '*', 'f', 'v'}, {'HMGET', state, 'reg'},
    {'XRANGE', KEYS[1], '-', '+'}, {'XRANGE', prefix .. 'delayed', '-', '+'},
    {'XADD', KEYS[1], '*', 'f', 'v'}, {'HSET', state, 'reg', 'v'}, {'ZSCORE', prefix .. 'idfloor', 'ms'}, {'TIME'},
    {'SPUBLISH', prefix .. 'wake:x', 'k'}})
  if err then return err end
end
local bad = misfit(KEYS[1], 'stream', 'the load-balancer stream')
if bad then return redis.error_reply(bad) end

-- Parse and check everything first.
local msgs, seen, order, created, states = {}, {}, {}, {}, {}
local at = 3
for i = 1, m do
  local key, reg, f = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  if not key or not f or f < 2 or f % 2 ~= 0 or at + 2 + f > #ARGV then
    return redis.error_reply('ERR lbs publish-1: message ' .. i .. ' is malformed')
  end
  msgs[i] = {key, at + 3, at + 2 + f}
  if not seen[key] then
    if reg == '' then
      return redis.error_reply('ERR lbs publish-1: the first message of key ' .. key .. ' has no registration')
    end
    seen[key] = reg
    order[#order + 1] = key
    local create
    bad, create, states[key] = publish_look(prefix, key)
    if bad then return redis.error_reply(bad) end
    created[key] = create or nil
  end
  at = at + 3 + f
end
if at - 1 ~= #ARGV then
  return redis.error_reply('ERR lbs publish-1: ' .. (#ARGV - at + 1) .. ' arguments left over')
end

-- The first id of each data stream created here: above every id a deleted one had.
local first
if next(created) then
  bad, first = publish_first(prefix)
  if bad then return redis.error_reply(bad) end
end

-- Writes.
local ids = {}
for i = 1, m do
  local msg = msgs[i]
  local key = msg[1]
  local id = '*'
  if created[key] then
    id, created[key] = first, nil
  end
  ids[i] = redis.call('XADD', prefix .. 'k:' .. key, id, unpack(ARGV, msg[2], msg[3]))
end
local registered = 0
local wakes = {}  -- the consumers to wake, in order, and each one's keys
for _, key in ipairs(order) do
  registered = registered + publish_register(KEYS[1], prefix, key, seen[key], states[key], wakes)
end
publish_wake(prefix, wakes)
return {ids, registered}
