-- A held key's state and messages, shared by the scripts that process keys
-- (fetch-1.lua, commit-1.lua; included where they say "--#include _keyed").
-- The key's state is the hash "<prefix>m:<key>", its messages the data
-- stream "<prefix>k:<key>" (fetch-1.lua's header has their fields).
--
-- keyed_state(leases, value, state[, extra]): the hold, checked before any
-- write: our hold `value` is "<token>:<consumer id>:<instance nonce>" (an LBS
-- entry is held while it is pending to its consumer and that consumer's
-- lease `leases` .. <consumer id> holds the nonce; each lease is read once a
-- call); false when the lease does not hold it; else the state's fields
-- {holder, pos, tries, fails, unblamed, until, token[, extra]} (HMGET's
-- reply, false for a field that is absent), or, for a state of another type
-- than hash, an error reply (a table with `err`: pcall, nothing stops).
--
-- keyed_alive(lbs, group, leases, id): whether LBS entry `id` is pending in
-- the group to a consumer whose lease exists (a live holder).
--
-- keyed_after(data, pos, count): up to `count` messages of data stream
-- `data` after position `pos` ("": from the first), XRANGE's reply, or an
-- error reply (pcall) for a key of another type than stream.
--
-- split_id(id): an entry id's milliseconds and sequence, as numbers; nil
-- for a string that is not "<digits>-<digits>".
-- id_below(a, b): a < b, for two entry ids.
local leases_read = {}
local function keyed_state(leases, value, state, extra)
  local consumer, nonce = string.match(value, '^%d+:(.*):([^:]*)$')
  if not consumer then return false end
  local held = leases_read[consumer]
  if held == nil then
    held = redis.pcall('GET', leases .. consumer)
    leases_read[consumer] = held
  end
  if held ~= nonce then return false end
  if extra then
    return redis.pcall('HMGET', state, 'holder', 'pos', 'tries', 'fails', 'unblamed', 'until', 'token', extra)
  end
  return redis.pcall('HMGET', state, 'holder', 'pos', 'tries', 'fails', 'unblamed', 'until', 'token')
end

local function keyed_alive(lbs, group, leases, id)
  local p = redis.pcall('XPENDING', lbs, group, id, id, 1)
  return type(p) == 'table' and p[1] ~= nil and redis.call('EXISTS', leases .. p[1][2]) == 1
end

local function keyed_after(data, pos, count)
  return redis.pcall('XRANGE', data, pos == '' and '-' or '(' .. pos, '+', 'COUNT', count)
end

local function split_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if ms then return tonumber(ms), tonumber(seq) end
end

local function id_below(a, b)
  local ams, aseq = split_id(a)
  local bms, bseq = split_id(b)
  return ams < bms or (ams == bms and aseq < bseq)
end
