-- holdfast sliding window log: several decisions on one key, in order, at
-- one instant of Redis time (driver.Many). Each is what slidingwindow.lua
-- decides alone at that instant; the log is trimmed and counted once.
-- (window.lua, put before this source, defines denied and add.)
--
-- KEYS[1]  the window
-- ARGV[1]  L, the limit in units per window; ARGV[2] W, the window in us
-- then for each decision: n, its cost (1 <= n <= L), its unique id, and
-- its deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: for each decision six integers: 0 and slidingwindow.lua's reply,
-- or 1 and five zeros for a decision whose deadline had passed (not
-- decided).
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
if not L or not W or L < 1 or W < 1 then
  return redis.error_reply('ERR holdfast sliding window: bad arguments')
end
for i = 3, #ARGV, 3 do
  local n = tonumber(ARGV[i])
  if not n or n < 1 or n > L or not ARGV[i + 1] or ARGV[i + 1] == '' then
    return redis.error_reply('ERR holdfast sliding window: bad arguments')
  end
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - W))
local count = redis.call('ZCARD', KEYS[1])
local out, o, added = {}, 0, false
for i = 3, #ARGV, 3 do
  local n, d = tonumber(ARGV[i]), ARGV[i + 2]
  local r
  if d ~= '' and now > tonumber(string.sub(d, 2)) then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 0, 0, 0, 0, 0
  else
    if count + n > L then
      r = denied(KEYS[1], L, W, now, count, n)
    else
      r = {1, L - count - n, 0, W, now}
      count = count + add(KEYS[1], now, n, ARGV[i + 1])
      added = true
    end
    out[o + 1] = 0
    for j = 1, 5 do
      out[o + 1 + j] = r[j]
    end
  end
  o = o + 6
end
-- As slidingwindow.lua: the key lives until the units added leave the window.
if added then
  redis.call('PEXPIRE', KEYS[1], math.floor(W / 1000) + 1)
end
return out
