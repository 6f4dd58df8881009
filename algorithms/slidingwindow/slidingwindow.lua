-- holdfast sliding window log: one decision.
--
-- Every admitted unit is a member of a sorted set scored by its admission
-- time, so the window is exact: at most L units in any window (now - W, now].
-- A request of cost n adds n members: id, id#1, ..., id#(n-1). Members are
-- unique request ids, so replaying a logged grant twice adds nothing twice.
--
-- KEYS[1]  the window: a sorted set, member = request id, score = time in us
-- ARGV[1]  L, the limit in units per window
-- ARGV[2]  W, the window in microseconds
-- ARGV[3]  n, the request's cost (1 <= n <= L)
-- ARGV[4]  the request's unique id
-- ARGV[5]  optional: "now" in us to use instead of Redis TIME (tests, replay)
--
-- Reply: {allowed (0|1), remaining units, retry_after_us, reset_after_us,
--         now_us}
-- (window.lua, put before this source, defines denied and add.)
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local id = ARGV[4]
if not L or not W or not n or L < 1 or W < 1 or n < 1 or n > L or not id or id == '' then
  return redis.error_reply('ERR holdfast sliding window: bad arguments')
end
-- NOW: the time the deadline guard read (driver.NewDecisionScript), if it did.
local now = tonumber(ARGV[5])
if not now or now <= 0 then
  now = NOW
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - W))
local count = redis.call('ZCARD', KEYS[1])
if count + n > L then
  return denied(KEYS[1], L, W, now, count, n)
end
-- PEEK (set before this source: slidingwindow.go) answers without adding.
if not PEEK then
  add(KEYS[1], now, n, id)
  -- The key lives until the unit just added leaves the window.
  redis.call('PEXPIRE', KEYS[1], math.floor(W / 1000) + 1)
end
return {1, L - count - n, 0, W, now}
