-- holdfast membership heartbeat: an instance says it is alive and learns how
-- many instances are.
--
-- KEYS[1]  the membership sorted set: member = instance id, score = Redis
--          time of its last heartbeat in us
-- ARGV[1]  the instance id
-- ARGV[2]  how long a heartbeat counts, in us
--
-- Reply: {live instances, now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - ttl))
redis.call('PEXPIRE', KEYS[1], math.floor(ttl / 1000) + 1)
return {redis.call('ZCARD', KEYS[1]), now}
