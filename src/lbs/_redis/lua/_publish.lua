-- Appending to a key's data stream and registering the key, shared by the
-- scripts that publish (publish-1.lua: a call's messages; promote-4.lua: a
-- delayed message when due; included where they say "--#include _publish",
-- after _checks and _time). publish-1.lua's header has the rules: the data
-- stream "<prefix>k:<key>", the state "<prefix>m:<key>", the first id of a
-- data stream above "<prefix>idfloor", a registration in force, the wakes.
--
-- publish_look(prefix, key): the key's keys, checked before any write: nil,
-- then whether its data stream is created by the next XADD (it does not
-- exist), then its state's {reg, who, lingers, holder} (HMGET's reply); else
-- the refusal "LBSKEY ..." (a data stream that is not a stream, a state that
-- is not a hash, or HMGET's error).
--
-- publish_first(prefix): nil, then the id of the first message of a data
-- stream created now: "<max(now ms, floor + 1)>-0"; else the refusal (an
-- idfloor that is not a sorted set).
--
-- publish_register(lbs, prefix, key, registration, state, wakes): once the
-- key's messages are appended: XADD the registration (lbs-input, lbs-keyed
-- "1") to the LBS `lbs` and HSET the state's "reg" unless a registration is
-- in force (`state`: publish_look's reply, read before the appends); a held
-- key that lingers goes into `wakes` ({} at first). 1 when registered, else 0.
--
-- publish_wake(prefix, wakes): one SPUBLISH "<prefix>wake:<who>" per consumer
-- in `wakes`, its message the JSON array of its keys, each once.
local function publish_look(prefix, key)
  local bad, kind = misfit(prefix .. 'k:' .. key, 'stream', 'a data stream')
  if bad then return bad end
  -- The state's registration and holder (a state of another type: HMGET's error).
  local state = prefix .. 'm:' .. key
  local got = redis.pcall('HMGET', state, 'reg', 'who', 'lingers', 'holder')
  if got.err then
    return misfit(state, 'hash', 'a key state') or got.err
  end
  return nil, kind == 'none', got
end

local function publish_first(prefix)
  local floor = prefix .. 'idfloor'
  local bad, kind = misfit(floor, 'zset', 'a sorted set')
  if bad then return bad end
  local after = kind == 'zset' and tonumber(redis.call('ZSCORE', floor, 'ms')) or -1
  return nil, string.format('%d-0', math.max(time_ms(), after + 1))
end

local function publish_register(lbs, prefix, key, registration, state, wakes)
  local reg, who, lingers, holder = state[1], state[2], state[3], state[4]
  -- Held: in force, and woken if it lingers.
  local in_force = reg and holder == reg
  if in_force and who and lingers then
    local keys = wakes[who]
    if not keys then
      keys = {}
      wakes[who] = keys
      wakes[#wakes + 1] = who
    end
    if not keys[key] then
      keys[key] = true
      keys[#keys + 1] = key
    end
  end
  -- Else in the LBS, or parked for a retry delay (commit-1.lua "fail:<ms>...") in the parking
  -- stream. pcall: a "reg" that is not an entry id (garbage) means not registered.
  if reg and not in_force then
    for _, where in ipairs({lbs, prefix .. 'delayed'}) do
      local found = redis.pcall('XRANGE', where, reg, reg, 'COUNT', 1)
      in_force = not found.err and #found > 0
      if in_force then break end
    end
  end
  if in_force then return 0 end
  local id = redis.call('XADD', lbs, '*', 'lbs-input', registration, 'lbs-keyed', '1')
  redis.call('HSET', prefix .. 'm:' .. key, 'reg', id)
  return 1
end

local function publish_wake(prefix, wakes)
  for _, who in ipairs(wakes) do
    local keys = {}
    for i, key in ipairs(wakes[who]) do keys[i] = key end
    redis.call('SPUBLISH', prefix .. 'wake:' .. who, cjson.encode(keys))
  end
end
