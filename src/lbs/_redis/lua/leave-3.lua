--[[
  Consumers leave the group: a closing process deletes its lease and its
  consumer; departed consumers are forgotten after a grace. Only a
  consumer with nothing pending is ever deleted (XGROUP DELCONSUMER would
  drop its pending entries), checked in the same step, so a read that
  delivers to it a moment later finds it gone and creates it again.

  KEYS[1]  the closing consumer's lease, {<service>-input}:lease:<consumer
           id> (ignored when ARGV[1] is "")
  KEYS[2]  the load-balancer stream, <service>-input
  KEYS[3]  the consumer deadline index, {<service>-input}:deadlines: a
           deleted consumer leaves it too (ZREM; a key of another type is
           left alone)

  ARGV[1]  the closing process's instance nonce (its lease's value); "": a
           sweep (no lease)
  ARGV[2]  consumer group
  ARGV[3]  the closing consumer's id; "": a sweep of every consumer
  ARGV[4]  a sweep's grace (ms): only consumers idle at least this long
           (since their last read or claim) are deleted
  ARGV[5]  optional: the tokens hashes' prefix, {<service>-input}:tokens:
           (see read-3.lua's ARGV[5]): a deleted consumer's is deleted too

  Output: {lease deleted (1 or 0), consumers deleted (a count)}. The lease
  is deleted only when it holds ARGV[1] (a newer process with the same
  consumer id may have taken it over), and only when the consumer has
  nothing pending: entries still pending to it (left by a close that could
  not hand them back) stay held until the lease expires, when recovery
  brings them back. A user the ACL denies XGROUP
  DELCONSUMER (or XINFO CONSUMERS, for a sweep) deletes no consumer; no
  group or no stream: nothing to delete.

  Events: del on the lease (when deleted) and a deleted consumer's tokens;
  zrem on the deadline index.
]]
local function nothing_pending(consumer)
  local p = redis.pcall('XPENDING', KEYS[2], ARGV[2], '-', '+', 1, consumer)
  return type(p) == 'table' and #p == 0
end

local records = ARGV[5] ~= nil and ARGV[5] ~= '' and ARGV[5] or nil
local marker = 0
if ARGV[1] ~= '' and redis.pcall('GET', KEYS[1]) == ARGV[1] and nothing_pending(ARGV[3]) then
  marker = redis.call('DEL', KEYS[1])
end
if not redis.acl_check_cmd('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], 'x') then
  return {marker, 0}
end

local deleted = 0
if ARGV[3] ~= '' then
  if nothing_pending(ARGV[3]) then
    local r = redis.pcall('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], ARGV[3])
    if type(r) == 'number' then
      deleted = 1
      redis.pcall('ZREM', KEYS[3], ARGV[3])
      if records then redis.pcall('DEL', records .. ARGV[3]) end
    end
  end
  return {marker, deleted}
end
if not redis.acl_check_cmd('XINFO', 'CONSUMERS', KEYS[2], ARGV[2]) then
  return {marker, 0}
end
local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[2], ARGV[2])
if type(consumers) ~= 'table' or consumers.err then return {marker, 0} end
local grace = tonumber(ARGV[4])
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['pending'] == 0 and tonumber(info['idle']) >= grace and nothing_pending(info['name']) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], info['name'])
    redis.pcall('ZREM', KEYS[3], info['name'])
    if records then redis.pcall('DEL', records .. info['name']) end
    deleted = deleted + 1
  end
end
return {marker, deleted}
