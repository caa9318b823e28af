-- Preconditions checked before a script's first write, so a refused call
-- writes nothing (included where a script says "--#include _checks").
--
-- key_type(key): TYPE's answer, "none" for a key that does not exist.
--
-- misfit(key, want, what): for a key that must be absent or of type `want`
-- ("stream", "zset", "hash", ...): nil when it is (or `key` is nil), else
-- the refusal "LBSKEY <key> holds a <type>, not <what>"; then the key's
-- type. A script returns the refusal as an error (redis.error_reply) or in
-- its reply (requeue-6.lua's {-2, message}, extend-n.lua's notes).
--
-- refused_by_acl(script, calls): every command a script may call (each
-- `calls` item a command and its arguments, on the keys it will touch) is
-- allowed by the ACL: nil, else the error "NOPERM lbs <script>: the ACL does
-- not allow <command and arguments>", so a missing permission refuses the
-- call whole instead of stopping it half-way.
local function key_type(key)
  return redis.call('TYPE', key)['ok']
end

local function misfit(key, want, what)
  if not key then return nil end
  local kind = key_type(key)
  if kind ~= 'none' and kind ~= want then
    return 'LBSKEY ' .. key .. ' holds a ' .. kind .. ', not ' .. what, kind
  end
  return nil, kind
end

local function refused_by_acl(script, calls)
  for _, c in ipairs(calls) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM lbs ' .. script .. ': the ACL does not allow ' .. table.concat(c, ' '))
    end
  end
end
