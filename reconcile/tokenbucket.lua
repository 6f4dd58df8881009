-- holdfast token bucket reconciliation: fold one batch of grants that an
-- instance admitted during an outage into the shared bucket, exactly once.
--
-- Grants are replayed in time order against the stored bucket: the bucket
-- refills between grants (capped at capacity) and each grant spends its cost.
-- A grant older than the stored update time (another instance reconciled, or
-- Redis decided, later than it) is subtracted without refill. The balance may
-- go below zero, a debt, but never below minus one full bucket.
--
-- KEYS[1]  the bucket hash (fields c, t), as in tokenbucket.lua
-- KEYS[2]  the batch marker: set NX in this same call, so a retried batch
--          is a no-op
-- ARGV[1]  C, capacity in tokens
-- ARGV[2]  T, microseconds to refill one token
-- ARGV[3]  marker TTL in milliseconds
-- ARGV[4]  seed credit (us) and ARGV[5] seed time (us; 0: no seed): the
--          instance's last known state of the bucket, used only when the key
--          is missing (Redis restarted empty, or the key expired when full:
--          refilling from the seed gives the same full bucket)
-- ARGV[6], ARGV[7], ...  pairs of grant time (us, Redis clock) and cost
--
-- Reply: {1, credit, t} when applied; {0, 0, 0} when the batch was applied
--        before.
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  return {0, 0, 0}
end
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local full = C * T
local credit, last
local s = redis.call('HMGET', KEYS[1], 'c', 't')
if s[1] then
  credit, last = tonumber(s[1]), tonumber(s[2])
  if not credit or not last then
    return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. KEYS[1])
  end
elseif tonumber(ARGV[5]) > 0 then
  credit, last = tonumber(ARGV[4]), tonumber(ARGV[5])
else
  credit, last = full, tonumber(ARGV[6]) or 0
end
for i = 6, #ARGV, 2 do
  local at, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if at > last then
    credit = credit + (at - last)
    if credit > full then
      credit = full
    end
    last = at
  end
  credit = credit - n * T
end
if credit < -full then
  credit = -full
end
redis.call('HSET', KEYS[1], 'c', string.format('%d', credit), 't', string.format('%d', last))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = math.floor((last + full - credit - now) / 1000) + 1
if ttl < 1 then
  ttl = 1
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, credit, last}
