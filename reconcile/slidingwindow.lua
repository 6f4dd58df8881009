-- holdfast sliding window reconciliation: fold one batch of grants that an
-- instance admitted during an outage into the shared window, exactly once.
--
-- Each grant's units are added with their ORIGINAL admission time as score
-- and the request id as member (id, id#1, ... for a cost above one), so the
-- window counts them where they happened, and adding a grant twice adds
-- nothing twice. Grants already outside the window are skipped.
--
-- KEYS[1]  the window sorted set, as in slidingwindow.lua
-- KEYS[2]  the batch marker: set in this same call
-- ARGV[1]  W, the window in microseconds
-- ARGV[2]  marker TTL in milliseconds
-- ARGV[3]  seed count, ARGV[4] seed time (us; 0: no seed), ARGV[5] seed
--          member prefix: the instance's last known count in the window and
--          the time of its newest unit; used only when the key is missing and
--          that time is still inside the window (Redis restarted empty)
-- ARGV[6], ARGV[7], ARGV[8], ...  triples of grant time (us), cost, id
--
-- Reply: {1, units in the window after} when applied; {0, 0} when the batch
--        was applied before.
-- The marker is checked first and set last (see tokenbucket.lua).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 0}
end
local W = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local z = {}
local newest = 0
local function add(score, member)
  z[#z + 1] = string.format('%d', score)
  z[#z + 1] = member
  if score > newest then
    newest = score
  end
  if #z >= 1000 then
    redis.call('ZADD', KEYS[1], unpack(z))
    z = {}
  end
end
local seedCount, seedAt = tonumber(ARGV[3]), tonumber(ARGV[4])
if seedCount > 0 and seedAt > now - W and redis.call('EXISTS', KEYS[1]) == 0 then
  for i = 1, seedCount do
    add(seedAt, ARGV[5] .. i)
  end
end
for i = 6, #ARGV, 3 do
  local at, n, id = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), ARGV[i + 2]
  if at > now - W then
    add(at, id)
    for j = 1, n - 1 do
      add(at, id .. '#' .. j)
    end
  end
end
if #z > 0 then
  redis.call('ZADD', KEYS[1], unpack(z))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - W))
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if top[2] then
  newest = math.max(newest, tonumber(top[2]))
  redis.call('PEXPIRE', KEYS[1], math.max(math.floor((newest + W - now) / 1000) + 1, 1))
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {1, redis.call('ZCARD', KEYS[1])}
