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
-- KEYS[3]  the epoch made by the last renewal (below), no TTL.
-- ARGV[1]  optional: an epoch to renew. An instance that found Redis back
--          on an older copy makes a new epoch, if the epoch is still that
--          one, so every instance finds the loss (a new epoch) and names
--          its restores after one epoch of its own; the first to renew
--          wins, the others read its epoch.
--
-- Reply: {epoch, now_us, generation, 1 if the epoch was made by a renewal
-- (the keys hold older states, not none) else 0}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = tonumber(redis.call('GET', KEYS[1]))
if not epoch then
  epoch = now
  redis.call('SET', KEYS[1], string.format('%d', epoch))
elseif ARGV[1] and epoch == tonumber(ARGV[1]) then
  epoch = now
  redis.call('SET', KEYS[1], string.format('%d', epoch))
  redis.call('SET', KEYS[3], string.format('%d', epoch))
end
local gen = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
redis.call('SET', KEYS[2], string.format('%d', gen))
local renewed = 0
if tonumber(redis.call('GET', KEYS[3])) == epoch then
  renewed = 1
end
return {epoch, now, gen, renewed}
