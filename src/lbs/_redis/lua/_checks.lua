-- A key's type checked before a script's first write, so a refused call
-- writes nothing (included where a script says "--#include _checks").
--
-- misfit(key, want, what): for a key that must be absent or of type `want`
-- ("stream", "zset", "hash", ...): nil when it is (or `key` is nil), else
-- the refusal "LBSKEY <key> holds a <type>, not <what>"; then the key's type
-- (TYPE's answer, "none" for a key that does not exist). A script returns
-- the refusal as an error (redis.error_reply) or in its reply (requeue-6.lua's
-- {-2, message}, extend-n.lua's notes).
local function misfit(key, want, what)
  if not key then return nil end
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= want then
    return 'LBSKEY ' .. key .. ' holds a ' .. kind .. ', not ' .. what, kind
  end
  return nil, kind
end
