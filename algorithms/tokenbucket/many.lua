-- holdfast token bucket: several decisions on one key, in order, at one
-- instant of Redis time (driver.Many). Each is what tokenbucket.lua
-- decides alone at that instant; the bucket is read once and written once.
-- (driver.NewMany puts now, costs_ok and decide_each before this source,
-- and bucket.lua idiv and credit_at.)
--
-- KEYS[1]  the bucket
-- ARGV[1]  C, capacity in tokens; ARGV[2] T, microseconds a token
-- then for each decision: n, its cost in tokens (1 <= n <= C), and its
-- deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: driver.Many's; each decision's as tokenbucket.lua gives it.
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
if not C or not T or C < 1 or T < 1 or not costs_ok(C) then
  return redis.error_reply('ERR holdfast token bucket: bad arguments')
end
local full = C * T
local credit, err, plain = credit_at(KEYS[1], now, full)
if err then
  return redis.error_reply(err)
end
local spent = false
local out = decide_each(function(i)
  local need = tonumber(ARGV[i]) * T
  if credit < need then
    local remaining = 0
    if credit > 0 then
      remaining = idiv(credit, T)
    end
    return 0, remaining, need - credit, full - credit, now
  end
  credit = credit - need
  spent = true
  return 1, idiv(credit, T), 0, full - credit, now
end)
-- As tokenbucket.lua: the key lives until the bucket is full again.
if spent then
  spend(KEYS[1], now, full, credit, plain)
end
return out
