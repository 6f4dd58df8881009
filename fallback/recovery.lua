-- holdfast recovery barrier: the instances coming back from one outage agree
-- on one Redis time at which they all return to deciding through Redis, so
-- no instance decides on a shared state that lacks another's unreplayed
-- grants. The time is set ahead by the first to arrive; it is brought
-- forward to now once every instance the arrivals know of has arrived, each
-- after its own replay (the barrier then has nothing left to wait for).
--
-- KEYS[1]  the barrier key: the close time, decimal us
-- KEYS[2]  the arrivals: a sorted set of instance id -> the instance count
--          it knew before the outage (0: it knew none), and member "@"
--          -> the close time the arrivals wait for (a set left by an
--          earlier barrier is not read)
-- ARGV[1]  how far ahead of now the first instance sets the time, in us
-- ARGV[2]  the arriving instance's id ("" or absent: a read, no arrival)
-- ARGV[3]  its instance count (0: unknown)
--
-- The close time comes forward only when every arrival knew a count and
-- as many as the largest of those counts have arrived: an instance that
-- started during the outage knows no count, and one that did not return
-- yet is not there to be counted, so either keeps the time ahead. Only
-- commands the documented ACL allows (docs/operations.md) are used.
--
-- Reply: {close_at_us, now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ahead = tonumber(ARGV[1])
local ttl = math.floor(3 * ahead / 1000) + 1
local at = tonumber(redis.call('GET', KEYS[1]))
if not at or at < now - ahead then
  at = now + ahead
  redis.call('SET', KEYS[1], string.format('%d', at), 'PX', ttl)
end
local arrivals = KEYS[2]
if not arrivals or at <= now then
  return {at, now}
end
local list = redis.call('ZRANGE', arrivals, 0, -1, 'WITHSCORES')
local mine = false
for k = 1, #list, 2 do
  if list[k] == '@' then
    mine = tonumber(list[k + 1]) == at
  end
end
if not mine then
  -- A new barrier: the arrivals of an earlier one do not count.
  redis.call('DEL', arrivals)
  redis.call('ZADD', arrivals, string.format('%d', at), '@')
  list = {}
end
local id = ARGV[2]
if id and id ~= '' and id ~= '@' then
  redis.call('ZADD', arrivals, string.format('%d', tonumber(ARGV[3]) or 0), id)
  list = redis.call('ZRANGE', arrivals, 0, -1, 'WITHSCORES')
end
redis.call('PEXPIRE', arrivals, ttl)
local n, want = 0, 0
for k = 1, #list, 2 do
  if list[k] ~= '@' then
    local c = tonumber(list[k + 1])
    if not c or c < 1 then
      return {at, now}
    end
    n = n + 1
    if c > want then
      want = c
    end
  end
end
if want > 0 and n >= want then
  at = now
  redis.call('SET', KEYS[1], string.format('%d', at), 'PX', ttl)
end
return {at, now}
