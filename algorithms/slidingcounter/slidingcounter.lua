-- holdfast sliding window counter: one decision.
--
-- Time is cut into fixed windows of W microseconds, aligned to multiples of
-- W in Redis time: window k is [k*W, (k+1)*W). The key counts the units
-- admitted in the current window (c) and in the one before it (p). At e
-- microseconds into the current window the counter estimates the units in
-- the sliding window (now - W, now] as p * (W - e) / W + c, and admits a
-- cost n when that estimate plus n is at most L. Integers only: the estimate
-- is compared as p * (W - e) + (c + n) * W <= L * W, which is the same as
-- c + n + ceil(p * (W - e) / W) <= L. Counts are read at most 2L, and L * W
-- is at most 2^50 (slidingcounter.MaxProduct), so every value stays an exact
-- integer below 2^53 and the Go twin (slidingcounter.Decide) agrees exactly.
--
-- The key holds ONE string, "k:c:p" in decimal: the current window's index,
-- its count and the previous window's count. It lives until the end of the
-- next window (at most 2W): by then both counts are outside the window, so a
-- key that expired reads the same as one that did not. A stored window later
-- than now's (a clock that stepped back) is read as at that window's start:
-- never more admitted than there.
--
-- KEYS[1]  the counter: a string "k:c:p"
-- ARGV[1]  L, the limit in units per window
-- ARGV[2]  W, the window in microseconds
-- ARGV[3]  n, the request's cost in units (1 <= n <= L)
-- ARGV[4]  optional: "now" in us to use instead of Redis TIME (tests, replay)
--
-- Reply: {allowed (0|1), remaining units, retry_after_us, reset_after_us,
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

local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if not L or not W or not n or L < 1 or W < 1 or n < 1 or n > L then
  return redis.error_reply('ERR holdfast sliding window counter: bad arguments')
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
-- The state as of now's window j: a window ago the current count becomes
-- the previous one; two windows ago both are gone.
local j = idiv(now, W)
local k, c, p = j, 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local sk, sc, sp = string.match(v, '^(%d+):(%d+):(%d+)$')
  if not sk then
    return redis.error_reply('ERR holdfast sliding window counter: corrupt state in ' .. KEYS[1])
  end
  sk, sc, sp = tonumber(sk), tonumber(sc), tonumber(sp)
  if sk >= j then
    k, c, p = sk, sc, sp
  elseif sk == j - 1 then
    p = sc
  end
end
if c > 2 * L then
  c = 2 * L
end
if p > 2 * L then
  p = 2 * L
end
local start = k * W
local e = 0
if now > start then
  e = now - start
end
-- The previous window's weighted count, rounded up.
local pw = idiv(p * (W - e) + W - 1, W)
if c + n + pw <= L then
  c = c + n
  -- The key lives until both counts have left the window: reset time.
  local life = start + 2 * W - now
  -- PEEK (set before this source: slidingcounter.go) answers without counting.
  if not PEEK then
    redis.call('SET', KEYS[1], string.format('%d:%d:%d', k, c, p), 'PX', string.format('%d', math.floor(life / 1000) + 1))
  end
  return {1, L - c - pw, 0, life, now}
end
-- Denied. The same cost fits once p * (W - e') <= (L - c - n) * W in this
-- window, or else once c * (W - e') <= (L - n) * W in the next.
local retry
local e1 = W
local room = L - c - n
if p > 0 and room >= 0 then
  e1 = W - idiv(room * W, p)
end
if e1 < W then
  retry = start + e1 - now
else
  local e2 = 0
  if c > 0 then
    e2 = W - idiv((L - n) * W, c)
    if e2 < 0 then
      e2 = 0
    end
  end
  retry = start + W + e2 - now
end
local reset = 0
if c > 0 then
  reset = start + 2 * W - now
elseif p > 0 then
  reset = start + W - now
end
local remaining = L - c - pw
if remaining < 0 then
  remaining = 0
end
return {0, remaining, retry, reset, now}
