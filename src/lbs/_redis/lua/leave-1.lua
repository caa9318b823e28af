--[[
  A consumer process leaves: delete its instance marker if it is still its own.

  KEYS[1]  the instance marker, {<service>-input}:instance:<consumer id>

  ARGV[1]  this process's instance nonce

  Output: 1 when deleted, 0 when the marker was absent or another
  process's (a newer process with the same consumer id took it over).

  Events: del on the marker (when deleted).
]]
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
