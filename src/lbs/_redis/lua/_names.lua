-- One holder per data stream name, shared by the scripts that take, release
-- and hand on a name (names-1.lua, done-n.lua, requeue-6.lua, promote-4.lua;
-- included where they say "--#include _names").
--
-- Keys, under the service's key prefix P = "{<service>-input}:" (the LBS's
-- slot), for a DataStreamName N:
--   P .. "name:" .. N     the name's holder, a string: "<entry id>" (held by
--                         that registration, nobody waits), "<entry id>+"
--                         (held, registrations wait) or "+<entry id>" (nobody
--                         holds it, registrations wait: the oldest of them is
--                         back in the LBS as that entry). No TTL: a holder is
--                         valid while its entry is pending in the group (held
--                         by the lease of the consumer it is pending to); one
--                         that is not pending is stale, and the next
--                         registration read takes the name over.
--   P .. "waiting:" .. N  the registrations waiting for N, a list of LBS entry
--                         ids, oldest first: each was read while N was held,
--                         acked without deletion (it stays in the LBS as its
--                         own record, no longer pending) and parked here.
--   P .. "waiting"        the names that have waiters, a sorted set scored by
--                         the server time (ms) at which promote-4.lua looks at
--                         the name again (a holder gone without releasing it).
--
-- name_of(fields): the DataStreamName of an entry's fields (an XRANGE or
-- XREADGROUP field list), nil when it has none (malformed: never name-locked).
-- An "lbs-input" that starts with the name (compact or with json.dumps's
-- default spaces) and has no escapes in it is read with one match; any other
-- JSON is decoded.
--
-- name_holder(v): a holder key's value parsed: the holding entry id ("" for
-- none), whether registrations wait, and the id of the waiter put back ("").
--
-- name_pending(lbs, group, id): whether entry id is pending in the group.
--
-- name_release(P, lbs, name, id, now_ms): after entry `id` left the
-- group (acked: done, re-queued, parked, dead-lettered), release its name if
-- it holds it; when registrations wait, the oldest that is still in the LBS
-- goes back into it as a fresh entry (its fields unchanged: no retry counted)
-- and the holder key becomes "+<its new id>" (or is deleted with the list's
-- last waiter).
-- Keys of another type are left alone (pcall): nothing is half-done.
-- Returns 1 when a waiter was put back, else 0.
--
-- name_promote(P, lbs, name, now_ms): the hand-on part of name_release (also
-- promote-4.lua's, for a holder that vanished without releasing its name).
local NAME_MAX_COPY = 7000
local NAME_RECHECK_MS = 10000

local function name_of(fields)
  if type(fields) ~= 'table' then return nil end
  for j = 1, #fields - 1, 2 do
    if fields[j] == 'lbs-input' then
      local v = fields[j + 1]
      local fast = string.match(v, '^{%s*"DataStreamName"%s*:%s*"([^"\\]*)"%s*[,}]')
      if fast then return fast end
      local ok, doc = pcall(cjson.decode, v)
      local name = ok and type(doc) == 'table' and doc['DataStreamName']
      if type(name) == 'string' then return name end
      return nil
    end
  end
  return nil
end

local function name_holder(v)
  if string.sub(v, 1, 1) == '+' then return '', true, string.sub(v, 2) end
  if string.sub(v, -1) == '+' then return string.sub(v, 1, -2), true, '' end
  return v, false, ''
end

local function name_pending(lbs, group, id)
  local p = redis.pcall('XPENDING', lbs, group, id, id, 1)
  return type(p) == 'table' and p[1] ~= nil
end

local function name_promote(prefix, lbs, name, now_ms)
  local wait, holder, index = prefix .. 'waiting:' .. name, prefix .. 'name:' .. name, prefix .. 'waiting'
  while true do
    local w = redis.pcall('LPOP', wait)
    if type(w) ~= 'string' then
      -- Nobody waits (or the list is not a list: left alone).
      if type(w) ~= 'table' then
        redis.pcall('DEL', holder)
        redis.pcall('ZREM', index, name)
      end
      return 0
    end
    local found = redis.pcall('XRANGE', lbs, w, w)
    if type(found) == 'table' and found[1] and #found[1][2] <= NAME_MAX_COPY then
      local copy = redis.call('XADD', lbs, '*', unpack(found[1][2]))
      redis.call('XDEL', lbs, w)
      if redis.call('LLEN', wait) > 0 then
        redis.call('SET', holder, '+' .. copy)
        redis.pcall('ZADD', index, 'XX', now_ms + NAME_RECHECK_MS, name)
      else
        redis.call('DEL', holder)
        redis.pcall('ZREM', index, name)
      end
      return 1
    end
    -- Gone from the LBS (trimmed, deleted by hand) or too wide to copy (kept there): the next.
  end
end

local function name_release(prefix, lbs, name, id, now_ms)
  local holder = prefix .. 'name:' .. name
  local v = redis.pcall('GET', holder)
  if v == id then
    redis.call('DEL', holder)
  elseif v == id .. '+' then
    return name_promote(prefix, lbs, name, now_ms)
  end
  return 0
end
