-- holdfast token bucket: give back an admission (core.Refunder).
--
-- Adds n tokens' credit back to the bucket, never beyond a full one; a full
-- bucket is a key that holds nothing, so then the key is deleted.
--
-- KEYS[1]  the bucket: a string, the decimal E (tokenbucket.lua)
-- ARGV[1]  C, capacity in tokens
-- ARGV[2]  T, microseconds to refill one token
-- ARGV[3]  n, the tokens to give back (1 <= n <= C)
--
-- Reply: {1} when credit was given back, {0} when the bucket was full.
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if not C or not T or not n or C < 1 or T < 1 or n < 1 or n > C then
  return redis.error_reply('ERR holdfast token bucket refund: bad arguments')
end
local v = redis.call('GET', KEYS[1])
if not v then
  return {0}
end
-- E, and perhaps a recovery's merge log after it (replay.lua), which a
-- refund ends as a decision does.
local e = tonumber(v) or tonumber(string.match(v, '^(%-?%d+)|'))
if not e then
  return redis.error_reply('ERR holdfast token bucket refund: corrupt state in ' .. KEYS[1])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local full = C * T
local credit = now - e
if credit > full then
  credit = full
end
credit = credit + n * T
if credit >= full then
  redis.call('DEL', KEYS[1])
  return {1}
end
-- E alone, living to the end of its quarter (life_ms, put before this
-- source with driver.LuaIDiv).
local e = now - credit
redis.call('SET', KEYS[1], string.format('%d', e), 'PX', life_ms(e, full, now))
return {1}
