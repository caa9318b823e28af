--[[
  Read a batch of assignments for one consumer and lock every one of them,
  atomically: an entry is never delivered (pending) without a lock, and a
  consumer never holds a lock without a place in the consumer deadline
  index, so one that dies at any moment leaves only locked work, which
  recovery's deadline poller brings back within the lock TTL.

  KEYS[1]  the load-balancer stream, <service>-input
  KEYS[2]  the service's fencing counter, {<service>-input}:fence
  KEYS[3]  the consumer deadline index, {<service>-input}:consumers (a
           sorted set: consumer id scored by server ms). A consumer taking
           locks is added with now + TTL if absent; an existing score (its
           last heartbeat's, earlier than these locks' expiry) is kept, so
           the poller never looks later than the oldest of its locks expire.

  ARGV[1]  consumer group
  ARGV[2]  consumer id: the consumer name in the group; lock values are
           "<token>:<consumer id>"
  ARGV[3]  most entries to read (COUNT)
  ARGV[4]  lock TTL in milliseconds
  ARGV[5]  lock key prefix, lock:{<service>-input}: (lock keys share the
           LBS's hash tag, so they live in this slot)
  ARGV[6]  ">" for new entries; "0" to re-read this consumer's own pending
           entries (after a read whose reply was lost)
  ARGV[7]  optional, with ">": also claim pending entries idle at least this
           many ms (XREADGROUP ... CLAIM, Redis >= 8.4); "" or absent: none.
           Claimed entries come first, as 4-element entries (id, fields,
           idle ms, earlier deliveries), and are locked like new ones: one
           whose lock is held (a live holder) gets its holder's value as its
           token and is left to it.

  Output: {entries, tokens, top}
    entries  {{id, {field, value, ...}}, ...} as XREADGROUP returns them (a
             pending entry deleted from the stream comes back with no fields)
    tokens   one per entry: the new fencing token (an integer), or the lock
             value already set (a string: "<token>:<consumer id>" of its
             holder). Re-reading ("0") takes no lock: it reports each lock's
             value, "" for none, so the client adopts the locks a lost reply
             had taken for it.
    top      when nothing was read: the id of the stream's newest entry ("0-0"
             when empty). XREAD BLOCK ... STREAMS <LBS> <top> wakes exactly
             when a newer entry arrives, which is the next one to deliver.

  XREADGROUP runs without BLOCK (scripts cannot block); the client waits
  with XREAD BLOCK between empty reads. Tokens come from one INCRBY per
  batch, so they are unique and only grow across every consumer.

  Events: none besides the keys it writes.
]]
local reply
if ARGV[6] == '>' and ARGV[7] and ARGV[7] ~= '' then
  reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'CLAIM', ARGV[7],
                     'STREAMS', KEYS[1], '>')
else
  reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], ARGV[6])
end
local entries = reply and reply[1] and reply[1][2] or {}
local n = #entries
if n == 0 then
  local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  return {{}, {}, newest[1] and newest[1][1] or '0-0'}
end
local tokens, taken = {}, false
if ARGV[6] ~= '>' then
  -- Re-reading our own pending entries: report their locks, take none.
  -- An unlocked one was disowned (its handler may still run); the deadline
  -- poller or the scan re-queues it.
  for i = 1, n do
    tokens[i] = redis.call('GET', ARGV[5] .. entries[i][1]) or ''
  end
  return {entries, tokens, ''}
end
local ttl = ARGV[4]
local last = redis.call('INCRBY', KEYS[2], n)
local first = last - n
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl)
for i = 1, n do
  local id = entries[i][1]
  local lock = ARGV[5] .. id
  local token = first + i
  if redis.call('SET', lock, token .. ':' .. ARGV[2], 'NX', 'PX', ttl) then
    tokens[i] = token
    taken = true
  else
    tokens[i] = redis.call('GET', lock) or ''
  end
end
if taken then
  redis.call('ZADD', KEYS[3], 'NX', deadline, ARGV[2])
end
return {entries, tokens, ''}
