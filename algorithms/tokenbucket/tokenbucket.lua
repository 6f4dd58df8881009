-- holdfast token bucket: one decision.
--
-- The bucket is kept as "credit": the time, in microseconds, that the bucket
-- has refilled and not spent. One token is worth T microseconds of credit, a
-- full bucket C*T. All numbers stay integers below 2^53, so Lua's doubles and
-- the Go twin agree exactly.
--
-- KEYS[1]  the bucket: a hash with fields c (credit, us) and t (last update,
--          Redis time in us)
-- ARGV[1]  C, capacity in tokens
-- ARGV[2]  T, microseconds to refill one token
-- ARGV[3]  n, the request's cost in tokens (1 <= n <= C)
-- ARGV[4]  optional: "now" in us to use instead of Redis TIME (tests, replay)
--
-- Reply: {allowed (0|1), remaining tokens, retry_after_us, reset_after_us,
--         now_us}
-- idiv is floor(a / b) for integers, exact even where a / b rounds.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if not C or not T or not n or C < 1 or T < 1 or n < 1 or n > C then
  return redis.error_reply('ERR holdfast token bucket: bad arguments')
end
local now = tonumber(ARGV[4])
if not now or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local full = C * T
local credit = full
local s = redis.call('HMGET', KEYS[1], 'c', 't')
if s[1] then
  local c, last = tonumber(s[1]), tonumber(s[2])
  if not c or not last then
    return redis.error_reply('ERR holdfast token bucket: corrupt state in ' .. KEYS[1])
  end
  credit = c
  if now > last then
    credit = credit + (now - last)
  end
  if credit > full then
    credit = full
  end
end
local need = n * T
if credit < need then
  local remaining = 0
  if credit > 0 then
    remaining = idiv(credit, T)
  end
  return {0, remaining, need - credit, full - credit, now}
end
credit = credit - need
redis.call('HSET', KEYS[1], 'c', string.format('%d', credit), 't', string.format('%d', now))
-- The key lives until the bucket is full again: then it equals a fresh one.
redis.call('PEXPIRE', KEYS[1], math.floor((full - credit) / 1000) + 1)
return {1, idiv(credit, T), 0, full - credit, now}
