-- holdfast sliding window reconciliation: fold one batch of grants that an
-- instance admitted during an outage into the shared window. This is the
-- body of driver.NewReplayScript's replay(key, i, n, fresh), which runs it
-- once per batch and keeps the markers that make a batch count once.
--
-- Each grant's units are added with their ORIGINAL admission time as score
-- and the request id as member (id, id#1, ... for a cost above one), so the
-- window counts them where they happened, and adding a grant twice adds
-- nothing twice. Grants already outside the window are skipped.
--
-- key      the window sorted set, as in slidingwindow.lua
-- fresh    true when key does not exist (driver.NewReplayScript)
-- shared[1]  W, the window in microseconds
-- ARGV[i]  seed count, ARGV[i+1] seed time (us; 0: no seed), ARGV[i+2] seed
--          member prefix: the instance's last known count in the window and
--          the time of its newest unit; used only when that time is still
--          inside the window and the key is missing (Redis restarted empty,
--          or a restore after Redis lost its data: a batch of no grants),
--          or, for a restore, to top a key that exists up to the seed's
--          count (Redis went back to an older copy of the key, or the key
--          was decided afresh since the loss): the units it lacks are
--          added at the seed's time.
-- ARGV[i+3], ARGV[i+4], ARGV[i+5], ...  up to ARGV[i+n-1]: triples of
--          grant time (us), cost, id
--
-- Reply: {1, units added}.
--
-- Every writer of a window key (this script and slidingwindow.lua) leaves
-- its TTL covering its newest member: the key lives until that member
-- leaves the window. So the TTL is only ever extended here, to cover the
-- newest unit added, and the set needs neither reading back nor trimming:
-- units already outside the window are trimmed by the next decision, or go
-- with the key. A fresh key (Redis restarted empty) costs two commands,
-- ZADD and PEXPIRE, and a PTTL first when the call cannot tell it is
-- fresh.
--
-- Arithmetic reads a decimal argument in one parse (Lua 5.1's tonumber
-- parses it twice); ReplayArgs writes only decimals. The units queue in z
-- (nz entries, score then member) and go to ZADD at most 500 at a time.
local W = shared[1]
local oldest = now - W
-- -2: no key; -1: a key without a TTL (not written by holdfast).
local pttl = -2
if not fresh then
  pttl = redis.call('PTTL', key)
end
local z, nz, added, newest = {}, 0, 0, 0
local seedCount, seedAt = 0 + ARGV[i], 0 + ARGV[i + 1]
if seedCount > 0 and seedAt > oldest and pttl ~= -2 then
  seedCount = 0
  if n == 3 then
    -- A restore into a key that exists: only the units it lacks. Units
    -- already out of the window are trimmed first, as a decision would.
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', oldest))
    seedCount = ARGV[i] - redis.call('ZCARD', key)
  end
end
if seedCount > 0 and seedAt > oldest then
  local score = string.format('%d', seedAt)
  for u = 1, seedCount do
    if nz >= 1000 then
      added, nz = added + redis.call('ZADD', key, unpack(z, 1, nz)), 0
    end
    z[nz + 1], z[nz + 2] = score, ARGV[i + 2] .. u
    nz = nz + 2
  end
  newest = seedAt
end
for j = i + 3, i + n - 1, 3 do
  local at = 0 + ARGV[j]
  if at > oldest then
    local score, id = ARGV[j], ARGV[j + 2]
    for u = 0, ARGV[j + 1] - 1 do
      if nz >= 1000 then
        added, nz = added + redis.call('ZADD', key, unpack(z, 1, nz)), 0
      end
      z[nz + 1], z[nz + 2] = score, u == 0 and id or id .. '#' .. u
      nz = nz + 2
    end
    if at > newest then
      newest = at
    end
  end
end
if nz > 0 then
  added = added + redis.call('ZADD', key, unpack(z, 1, nz))
end
if newest > 0 then
  -- The key lives at least until the newest unit added leaves the window;
  -- a TTL already longer is kept.
  local ttl = newest + W - now
  ttl = (ttl - ttl % 1000) / 1000 + 1
  if ttl < 1 then
    ttl = 1
  end
  if pttl == -1 then
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    ttl = math.max(ttl, math.floor((tonumber(top[2]) + W - now) / 1000) + 1)
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  elseif pttl < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
end
return {1, added}
