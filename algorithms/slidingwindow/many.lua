-- holdfast sliding window log: several decisions on one key, in order, at
-- one instant of Redis time (driver.Many). Each is what slidingwindow.lua
-- decides alone at that instant; the log is trimmed and counted once.
-- (driver.NewMany puts now, costs_ok and decide_each before this source,
-- and window.lua denied and add.)
--
-- KEYS[1]  the window
-- ARGV[1]  L, the limit in units per window; ARGV[2] W, the window in us
-- then for each decision: n, its cost (1 <= n <= L), its unique id, and
-- its deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: driver.Many's; each decision's as slidingwindow.lua gives it.
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
if not L or not W or L < 1 or W < 1 or not costs_ok(L) then
  return redis.error_reply('ERR holdfast sliding window: bad arguments')
end
for i = FIRST + 1, #ARGV, EACH + 1 do
  if ARGV[i] == '' then
    return redis.error_reply('ERR holdfast sliding window: bad arguments')
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - W))
local count = redis.call('ZCARD', KEYS[1])
local added = false
local out = decide_each(function(i)
  local n = tonumber(ARGV[i])
  if count + n > L then
    return unpack(denied(KEYS[1], L, W, now, count, n))
  end
  local before = count
  count = count + add(KEYS[1], now, n, ARGV[i + 1])
  added = true
  return 1, L - before - n, 0, W, now
end)
-- As slidingwindow.lua: the key lives until the units added leave the window.
if added then
  redis.call('PEXPIRE', KEYS[1], math.floor(W / 1000) + 1)
end
return out
