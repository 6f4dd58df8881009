-- holdfast recovery barrier: the instances coming back from one outage agree
-- on one Redis time at which they all return to deciding through Redis, so
-- no instance decides on a shared state that lacks another's unreplayed
-- grants.
--
-- KEYS[1]  the barrier key
-- ARGV[1]  how far ahead of now the first instance sets the time, in us
--
-- Reply: {close_at_us, now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ahead = tonumber(ARGV[1])
local at = tonumber(redis.call('GET', KEYS[1]))
if not at or at < now - ahead then
  at = now + ahead
  redis.call('SET', KEYS[1], string.format('%d', at), 'PX', math.floor(3 * ahead / 1000) + 1)
end
return {at, now}
