-- holdfast data epoch, read with every membership heartbeat and, while the
-- breaker is closed, every 100 ms (fallback's epochEvery).
--
-- KEYS[1]  the epoch: the Redis time (us) at which it was made, with no
--          TTL, so that it lives as long as Redis keeps its data. A call
--          that finds it missing makes a new one: an instance that read
--          another epoch before knows Redis lost its data.
--
-- Reply: {epoch, now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = tonumber(redis.call('GET', KEYS[1]))
if not epoch then
  epoch = now
  redis.call('SET', KEYS[1], string.format('%d', epoch))
end
return {epoch, now}
