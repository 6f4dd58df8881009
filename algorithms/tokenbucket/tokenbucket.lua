-- holdfast token bucket: one decision.
--
-- The bucket is kept as "credit": the time, in microseconds, that the bucket
-- has refilled and not spent. One token is worth T microseconds of credit, a
-- full bucket C*T. All numbers stay integers below 2^53, so Lua's doubles and
-- the Go twin agree exactly.
--
-- The key holds ONE integer, E: the instant (Redis time, us) at which the
-- bucket held, or will hold, zero credit. Credit refills one microsecond per
-- microsecond, so at any time x the bucket holds min(C*T, x - E); a bucket
-- updated at t with credit c is stored as E = t - c. One integer is a string
-- Redis keeps INT-encoded: 72 bytes a key (MEMORY USAGE), against 104 for a
-- "c:t" string and 120 for the hash {c, t} this replaced. After a
-- recovery's replay the value may be followed by a merge log
-- ("E|...", replay.lua); the first decision writes E alone again.
--
-- KEYS[1]  the bucket: a string, the decimal E
-- ARGV[1]  C, capacity in tokens
-- ARGV[2]  T, microseconds to refill one token
-- ARGV[3]  n, the request's cost in tokens (1 <= n <= C)
-- ARGV[4]  optional: "now" in us to use instead of Redis TIME (tests, replay)
--
-- Reply: {allowed (0|1), remaining tokens, retry_after_us, reset_after_us,
--         now_us}
-- (bucket.lua, put before this source, defines empty and credit_at.)
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if not C or not T or not n or C < 1 or T < 1 or n < 1 or n > C then
  return redis.error_reply('ERR holdfast token bucket: bad arguments')
end
-- NOW: the time the deadline guard read (driver.NewDecisionScript), if it did.
local now = tonumber(ARGV[4])
if not now or now <= 0 then
  now = NOW
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
end
local full = C * T
local credit, err, plain = credit_at(KEYS[1], now, full)
if err then
  return redis.error_reply(err)
end
local need = n * T
if credit < need then
  local remaining = 0
  if credit > 0 then
    remaining = idiv(credit, T)
  end
  return {0, remaining, need - credit, full - credit, now}
end
-- The key lives until the bucket is full again: then it equals a fresh one
-- (spend, bucket.lua). PEEK (set before this source: tokenbucket.go)
-- answers without spending.
if not PEEK then
  spend(KEYS[1], now, full, credit - need, plain)
end
credit = credit - need
return {1, idiv(credit, T), 0, full - credit, now}
