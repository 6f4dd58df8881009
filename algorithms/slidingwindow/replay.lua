-- holdfast sliding window reconciliation: fold one batch of grants that an
-- instance admitted during an outage into the shared window. This is the
-- body of driver.NewReplayScript's replay(key, i, n), which runs it
-- once per batch and keeps the markers that make a batch count once.
--
-- Each grant's units are added with their ORIGINAL admission time as score
-- and the request id as member (id, id#1, ... for a cost above one), so the
-- window counts them where they happened, and adding a grant twice adds
-- nothing twice. Grants already outside the window are skipped.
--
-- key      the window sorted set, as in slidingwindow.lua
-- ARGV[i]  W, the window in microseconds
-- ARGV[i+1]  seed count, ARGV[i+2] seed time (us; 0: no seed), ARGV[i+3] seed
--          member prefix: the instance's last known count in the window and
--          the time of its newest unit; used only when the key is missing and
--          that time is still inside the window (Redis restarted empty)
-- ARGV[i+4], ARGV[i+5], ARGV[i+6], ...  up to ARGV[i+n-1]: triples of
--          grant time (us), cost, id
--
-- Reply: {1, units added}.
--
-- Every writer of a window key (this script and slidingwindow.lua) leaves
-- its TTL covering its newest member: the key lives until that member
-- leaves the window. So the TTL is only ever extended here, to cover the
-- newest unit added, and the set needs neither reading back nor trimming:
-- units already outside the window are trimmed by the next decision, or go
-- with the key. A fresh key (Redis restarted empty) costs three commands:
-- PTTL, ZADD, PEXPIRE.
-- Arithmetic reads a decimal argument in one parse (Lua 5.1's tonumber
-- parses it twice); ReplayArgs writes only decimals.
local W = 0 + ARGV[i]
local oldest = now - W
-- -2: no key; -1: a key without a TTL (not written by holdfast).
local pttl = redis.call('PTTL', key)
local z = {}
local added = 0
local newest = 0
local function flush()
  added = added + redis.call('ZADD', key, unpack(z))
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
local seedCount, seedAt = 0 + ARGV[i + 1], 0 + ARGV[i + 2]
if seedCount > 0 and seedAt > oldest and pttl == -2 then
  local score = string.format('%d', seedAt)
  for u = 1, seedCount do
    add(score, ARGV[i + 3] .. u)
  end
  newest = seedAt
end
for j = i + 4, i + n - 1, 3 do
  local at = 0 + ARGV[j]
  if at > oldest then
    local score, id = ARGV[j], ARGV[j + 2]
    add(score, id)
    for u = 1, ARGV[j + 1] - 1 do
      add(score, id .. '#' .. u)
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
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    ttl = math.max(ttl, math.floor((tonumber(top[2]) + W - now) / 1000) + 1)
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  elseif pttl < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
end
return {1, added}
