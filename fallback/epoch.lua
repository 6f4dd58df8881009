-- holdfast data epoch, read with every membership heartbeat and, while the
-- breaker is closed, every 100 ms (fallback's epochEvery).
--
-- KEYS[1]  the epoch: the Redis time (us) at which it was made, with no
--          TTL, so that it lives as long as Redis keeps its data. A call
--          that finds it missing makes a new one: an instance that read
--          another epoch before knows Redis lost its data.
-- KEYS[2]  the generation: a count, with no TTL, that every call raises
--          by one (GET and SET, the commands holdfast's ACL already has).
--          Redis that went back to an older copy of its data (restarted
--          from an older RDB snapshot or a lagging AOF, failed over to a
--          replica that missed writes) keeps the epoch but answers a
--          generation no higher than one an instance read before: it lost
--          the writes since.
--
-- Reply: {epoch, now_us, generation}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = tonumber(redis.call('GET', KEYS[1]))
if not epoch then
  epoch = now
  redis.call('SET', KEYS[1], string.format('%d', epoch))
end
local gen = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
redis.call('SET', KEYS[2], string.format('%d', gen))
return {epoch, now, gen}
