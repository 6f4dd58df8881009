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
  -- The k-th oldest unit must leave the window before n more fit.
  local k = count + n - L
  local kth = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local remaining = L - count
  if remaining < 0 then
    remaining = 0
  end
  return {0, remaining, tonumber(kth[2]) + W - now, tonumber(newest[2]) + W - now, now}
end
local z = {}
local score = string.format('%d', now)
for i = 0, n - 1 do
  z[#z + 1] = score
  if i == 0 then
    z[#z + 1] = id
  else
    z[#z + 1] = id .. '#' .. i
  end
end
-- PEEK (set before this source: slidingwindow.go) answers without adding.
if not PEEK then
  redis.call('ZADD', KEYS[1], unpack(z))
  -- The key lives until the unit just added leaves the window.
  redis.call('PEXPIRE', KEYS[1], math.floor(W / 1000) + 1)
end
return {1, L - count - n, 0, W, now}
