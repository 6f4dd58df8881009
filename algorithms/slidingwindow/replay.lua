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
-- Reply: {1, units added} when applied; {0, 0} when the batch was applied
--        before.
-- The marker is checked first and set last (see the token bucket's replay.lua).
--
-- Every writer of a window key (this script and slidingwindow.lua) leaves
-- its TTL covering its newest member: the key lives until that member
-- leaves the window. So the TTL is only ever extended here, to cover the
-- newest unit added, and the set needs neither reading back nor trimming:
-- units already outside the window are trimmed by the next decision, or go
-- with the key. A fresh key (Redis restarted empty) costs six commands:
-- EXISTS, TIME, PTTL, ZADD, PEXPIRE, SET.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 0}
end
local W = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local oldest = now - W
-- -2: no key; -1: a key without a TTL (not written by holdfast).
local pttl = redis.call('PTTL', KEYS[1])
local z = {}
local added = 0
local newest = 0
local function flush()
  added = added + redis.call('ZADD', KEYS[1], unpack(z))
  z = {}
end
-- add queues one unit; score is a decimal integer string.
local function add(score, member)
  z[#z + 1] = score
  z[#z + 1] = member
  if #z >= 1000 then
    flush()
  end
end
local seedCount, seedAt = tonumber(ARGV[3]), tonumber(ARGV[4])
if seedCount > 0 and seedAt > oldest and pttl == -2 then
  local score = string.format('%d', seedAt)
  for i = 1, seedCount do
    add(score, ARGV[5] .. i)
  end
  newest = seedAt
end
for i = 6, #ARGV, 3 do
  local at = tonumber(ARGV[i])
  if at > oldest then
    local score, id = string.format('%d', at), ARGV[i + 2]
    add(score, id)
    for j = 1, tonumber(ARGV[i + 1]) - 1 do
      add(score, id .. '#' .. j)
    end
    if at > newest then
      newest = at
    end
  end
end
if #z > 0 then
  flush()
end
if newest > 0 then
  -- The key lives at least until the newest unit added leaves the window;
  -- a TTL already longer is kept.
  local ttl = math.max(math.floor((newest + W - now) / 1000) + 1, 1)
  if pttl == -1 then
    local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    ttl = math.max(ttl, math.floor((tonumber(top[2]) + W - now) / 1000) + 1)
    redis.call('PEXPIRE', KEYS[1], ttl)
  elseif pttl < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {1, added}
