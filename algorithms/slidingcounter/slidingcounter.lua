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
-- (counter.lua, put before this source, defines read and judge.)
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
local k, c, p = read(KEYS[1], now, L, W)
if not k then
  return redis.error_reply(c)
end
local ok, c2, remaining, retry, reset = judge(L, W, now, k, c, p, n)
if ok then
  -- PEEK (set before this source: slidingcounter.go) answers without counting.
  if not PEEK then
    redis.call('SET', KEYS[1], string.format('%d:%d:%d', k, c2, p), 'PX', string.format('%d', math.floor(reset / 1000) + 1))
  end
  return {1, remaining, 0, reset, now}
end
return {0, remaining, retry, reset, now}
