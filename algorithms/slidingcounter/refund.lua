-- holdfast sliding window counter: give back an admission (core.Refunder).
--
-- Takes n units off the count of the fixed window the admission was counted
-- in: the current one if the key is still in it, the previous one if the
-- key has moved on by one window; nothing once it is older.
--
-- KEYS[1]  the counter: a string "k:c:p" (slidingcounter.lua)
-- ARGV[1]  W, the window in microseconds
-- ARGV[2]  n, the admission's cost
-- ARGV[3]  its admission time in us (Redis time)
--
-- Reply: {units taken off}
local W = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local at = tonumber(ARGV[3])
if not W or not n or not at or W < 1 or n < 1 or at < 0 then
  return redis.error_reply('ERR holdfast sliding window counter refund: bad arguments')
end
local v = redis.call('GET', KEYS[1])
if not v then
  return {0}
end
local k, c, p = string.match(v, '^(%d+):(%d+):(%d+)$')
if not k then
  return redis.error_reply('ERR holdfast sliding window counter refund: corrupt state in ' .. KEYS[1])
end
k, c, p = tonumber(k), tonumber(c), tonumber(p)
local j = math.floor(at / W)
if j * W > at then
  j = j - 1
end
local took = 0
if k == j then
  took = math.min(c, n)
  c = c - took
elseif k == j + 1 then
  took = math.min(p, n)
  p = p - took
end
if took > 0 then
  redis.call('SET', KEYS[1], string.format('%d:%d:%d', k, c, p), 'KEEPTTL')
end
return {took}
