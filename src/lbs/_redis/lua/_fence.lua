-- The service's fencing counter, shared by the scripts that hand out tokens
-- (read-3.lua, reap-3.lua; included where they say "--#include _fence").
--
-- fence_check(key, count): before any write. nil and the counter's value (false
-- when it does not exist) when `count` more tokens can be taken; otherwise the error
-- "LBSKEY <key> ..." (a key of another type, a string that is not a plain
-- decimal integer, or a value that would pass 2^53: Lua numbers are doubles,
-- and a token past 2^53 would lose precision).
--
-- fence_take(key, current, n, t): takes n tokens (`current`: fence_check's
-- value); returns `first`, the tokens being first + 1 .. first + n, and sets the
-- counter to the last of them (one SET). The tokens never start below the server time
-- `t` (TIME's reply) in microseconds: one that does not exist (a restart
-- without persistence, an eviction) or that went back (a failover to a replica
-- that had not received the last tokens: replication is asynchronous) moves up
-- to it first, so tokens never go backwards while the servers' clocks agree
-- within the time a failover takes (Sentinel's down-after-milliseconds, at
-- least) and fewer than a million tokens are taken a second.
--
-- fence_digits: the format that prints a token exactly (up to 16 digits,
-- more than tostring's 14): '%d' through a C long where it has 64 bits,
-- else '%.0f'.
local TWO53 = 9007199254740992

local function fence_check(key, count)
  local v = redis.pcall('GET', key)  -- one call: the type is asked only when it is wrong
  if type(v) == 'table' then
    return redis.error_reply('LBSKEY ' .. key .. ' holds a ' .. redis.call('TYPE', key)['ok'] ..
                             ', not the fencing counter')
  end
  if not v then return nil, false end
  if not (v == '0' or string.match(v, '^[1-9]%d*$')) then
    return redis.error_reply('LBSKEY ' .. key ..
                             ' holds a string that is not a plain decimal integer, not the fencing counter')
  end
  local shown = #v <= 40 and v or (string.sub(v, 1, 40) .. '...')
  if #v > 16 or tonumber(v) >= TWO53 then
    return redis.error_reply('LBSKEY ' .. key .. ' holds ' .. shown .. ': the fencing counter is past 2^53')
  end
  if tonumber(v) + count >= TWO53 then
    return redis.error_reply('LBSKEY ' .. key .. ' holds ' .. shown .. ': the fencing counter would pass 2^53 '
                             .. 'taking ' .. count .. ' tokens')
  end
  return nil, tonumber(v)
end

local fence_digits = string.format('%d', 2 ^ 52) == '4503599627370496' and '%d' or '%.0f'

local function fence_take(key, current, n, t)
  -- `current`: fence_check's reading of the counter (false: none). Microseconds, exact in a
  -- double until the year 2255; one SET, as the INCRBY it replaces (no second read).
  local first = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if current and current > first then first = current end
  redis.call('SET', key, string.format(fence_digits, first + n))
  return first
end
