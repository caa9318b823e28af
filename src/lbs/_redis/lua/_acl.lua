-- The ACL checked before a script's first write, shared by the scripts that
-- process keys (publish-1.lua, fetch-1.lua, commit-1.lua; promote-4.lua for
-- a delayed publish; included where they say "--#include _acl").
--
-- refused_by_acl(script, calls): every command a script may call (each
-- `calls` item a command and its arguments, on the keys it will touch) is
-- allowed by the ACL: nil, else the error "NOPERM lbs <script>: the ACL does
-- not allow <command and arguments>", so a missing permission refuses the
-- call whole instead of stopping it half-way.
local function refused_by_acl(script, calls)
  for _, c in ipairs(calls) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM lbs ' .. script .. ': the ACL does not allow ' .. table.concat(c, ' '))
    end
  end
end
