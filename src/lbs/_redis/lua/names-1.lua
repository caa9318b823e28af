--[[
  Take the data stream names of a read batch one by one: the rare half of
  the Lua-free read (lbs._redis.reads). There a batch's names are taken with
  one MSETNX, which sets all or none; when it set none (a name is held, or
  two entries of the batch share one) the batch comes here. One holder per
  name (_names.lua): an entry whose name another entry still pending in the
  group holds waits.

  KEYS[1]  the load-balancer stream, <service>-input
  ARGV[1]  consumer group
  ARGV[2]  the service's key prefix, {<service>-input}: (same slot; the name
           keys, waiting lists and the waiting index are not declared)
  ARGV[3..] pairs: an entry's DataStreamName, then its id (entries this
           consumer read and holds; in their batch's order)

  For each pair, in order: SET <prefix>name:<name> <id> NX GET:
    * it set the key, or the key held this id (with or without "+"): the
      entry holds its name ("");
    * the key's holder is still pending in the group: the entry waits: it is
      acked (not deleted: it stays in the LBS as its own record), appended to
      <prefix>waiting:<name>, the holder key marked "<holder>+" and the name
      scored in the waiting index <prefix>waiting ("WAIT <holder id>");
    * the holder is no longer pending: the name is this entry's now;
    * a key of another type (the holder key, the waiting list, the index):
      nothing of that name is written ("WRONGTYPE <type> <key>").
  Each pair is handled whole before the next.

  Preconditions, checked before the first write: the ACL allows what an
  entry that waits writes (else "NOPERM lbs names-1: ...", nothing written);
  a malformed call gives "ERR lbs names-1: ..." (nothing written).

  Output: one string per pair, as above.

  Events: set on holder keys; xack, rpush, zadd for an entry that waits.
]]
--#include _names
--#include _time
if #KEYS ~= 1 or not ARGV[2] or ARGV[2] == '' or (#ARGV - 2) % 2 ~= 0 then
  return redis.error_reply('ERR lbs names-1: expected 1 key, the group, the key prefix and name/id pairs')
end
local lbs, group, prefix = KEYS[1], ARGV[1], ARGV[2]
local index = prefix .. 'waiting'
local function denied(what)
  return redis.error_reply('NOPERM lbs names-1: this user may not run ' .. what .. '; nothing was written')
end
local probe = prefix .. 'name:x'
if not redis.acl_check_cmd('SET', probe, '1', 'NX', 'GET') then return denied('SET on ' .. probe) end
if not redis.acl_check_cmd('XACK', lbs, group, '0-1') then return denied('XACK on ' .. lbs) end
if not redis.acl_check_cmd('RPUSH', prefix .. 'waiting:x', '0-1') then
  return denied('RPUSH on ' .. prefix .. 'waiting:x')
end
if not redis.acl_check_cmd('ZADD', index, 'NX', '1', 'x') then return denied('ZADD on ' .. index) end

local function key_type(key)
  return redis.call('TYPE', key)['ok']
end
local now_ms
local index_kind  -- the waiting index's type, asked when an entry must wait
local out = {}
for i = 3, #ARGV - 1, 2 do
  local name, id = ARGV[i], ARGV[i + 1]
  local hkey = prefix .. 'name:' .. name
  local v = redis.pcall('SET', hkey, id, 'NX', 'GET')
  local result = ''
  if type(v) == 'table' then
    result = 'WRONGTYPE ' .. key_type(hkey) .. ' ' .. hkey
  elseif v then
    local h, marked = name_holder(v)
    if h ~= id then
      if h ~= '' and name_pending(lbs, group, h) then
        local wkey = prefix .. 'waiting:' .. name
        local kind = key_type(wkey)
        if index_kind == nil then index_kind = key_type(index) end
        if kind ~= 'none' and kind ~= 'list' then
          result = 'WRONGTYPE ' .. kind .. ' ' .. wkey
        elseif index_kind ~= 'none' and index_kind ~= 'zset' then
          result = 'WRONGTYPE ' .. index_kind .. ' ' .. index
        else
          now_ms = now_ms or time_ms()
          redis.call('XACK', lbs, group, id)
          redis.call('RPUSH', wkey, id)
          if not marked then redis.call('SET', hkey, h .. '+') end
          redis.call('ZADD', index, 'NX', now_ms + NAME_RECHECK_MS, name)
          result = 'WAIT ' .. h
        end
      else
        -- Its holder is gone (not pending): the name is this entry's now.
        redis.call('SET', hkey, marked and (id .. '+') or id)
      end
    end
  end
  out[#out + 1] = result
end
return out
