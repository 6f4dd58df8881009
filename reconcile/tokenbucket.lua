-- holdfast token bucket reconciliation: fold one batch of grants that an
-- instance admitted during an outage into the shared bucket, exactly once,
-- charging each batch its MARGINAL cost in one global bucket.
--
-- The first batch of a recovery records the bucket as it stood (the base) in
-- a merge log; every batch adds its grants to the log. The bucket fed all
-- logged grants in time order (refilling between grants, capped at capacity)
-- is computed with and without this batch's grants; the difference, at the
-- latest grant time, is what this batch costs, and is charged to the stored
-- bucket. Instances reconciling one after another thus end exactly where one
-- global bucket fed all their grants would be, whatever their order; decisions
-- Redis made meanwhile stay counted. The balance may become a debt, of at
-- most one full bucket.
--
-- KEYS[1]  the bucket hash (fields c, t), as in tokenbucket.lua
-- KEYS[2]  the batch marker: set in this same call, so a retried batch is a
--          no-op
-- KEYS[3]  the merge log: a list, "base credit t" then "at cost" per grant
-- ARGV[1]  C, capacity in tokens
-- ARGV[2]  T, microseconds to refill one token
-- ARGV[3]  marker TTL in milliseconds
-- ARGV[4]  seed credit (us) and ARGV[5] seed time (us; 0: no seed): the
--          instance's last known state of the bucket, used only when the key
--          is missing (Redis restarted empty, or the key expired when full:
--          refilling from the seed gives the same full bucket)
-- ARGV[6]  merge log TTL in milliseconds, set when the log is created: how
--          long one recovery's replays are merged; it must end before
--          decisions through Redis resume, since those are not in the log
-- ARGV[7], ARGV[8], ...  pairs of grant time (us, Redis clock) and cost
--
-- Reply: {1, credit, t} when applied; {0, 0, 0} when the batch was applied
--        before.
-- The marker is checked first and set last: a script that fails midway
-- (Redis does not roll back) leaves no marker, so the retry applies the batch
-- again — at worst counted twice, never lost.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 0, 0}
end
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local full = C * T

local cur_c, cur_t
local s = redis.call('HMGET', KEYS[1], 'c', 't')
if s[1] then
  cur_c, cur_t = tonumber(s[1]), tonumber(s[2])
  if not cur_c or not cur_t then
    return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. KEYS[1])
  end
elseif tonumber(ARGV[5]) > 0 then
  cur_c, cur_t = tonumber(ARGV[4]), tonumber(ARGV[5])
else
  cur_c, cur_t = full, 0
end

-- A merge log past MAXLOG entries is not read again: a batch then is charged
-- against the stored bucket alone (conservative), so one call's work stays
-- bounded on a hot key.
local MAXLOG = 2000
local log = {}
local merging = redis.call('LLEN', KEYS[3]) <= MAXLOG
if merging then
  log = redis.call('LRANGE', KEYS[3], 0, -1)
end
local base_c, base_t = cur_c, cur_t
local prev, all = {}, {}
if #log > 0 then
  local bc, bt = string.match(log[1], '^base (%-?%d+) (%-?%d+)$')
  if not bc then
    return redis.error_reply('ERR holdfast reconcile: corrupt merge log ' .. KEYS[3])
  end
  base_c, base_t = tonumber(bc), tonumber(bt)
  for i = 2, #log do
    local at, n = string.match(log[i], '^(%-?%d+) (%d+)$')
    if not at then
      return redis.error_reply('ERR holdfast reconcile: corrupt merge log ' .. KEYS[3])
    end
    local g = {tonumber(at), tonumber(n)}
    prev[#prev + 1] = g
    all[#all + 1] = g
  end
elseif redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('RPUSH', KEYS[3], string.format('base %d %d', base_c, base_t))
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
local push = {}
for i = 7, #ARGV, 2 do
  local g = {tonumber(ARGV[i]), tonumber(ARGV[i + 1])}
  all[#all + 1] = g
  if merging then
    push[#push + 1] = string.format('%d %d', g[1], g[2])
  end
  if #push >= 1000 then
    redis.call('RPUSH', KEYS[3], unpack(push))
    push = {}
  end
end
if #push > 0 then
  redis.call('RPUSH', KEYS[3], unpack(push))
end

local function byTime(a, b)
  return a[1] < b[1]
end
table.sort(prev, byTime)
table.sort(all, byTime)

-- run feeds grants to the base bucket; returns its credit and time.
local function run(grants)
  local c, last = base_c, base_t
  for _, g in ipairs(grants) do
    if g[1] > last then
      c = math.min(full, c + (g[1] - last))
      last = g[1]
    end
    c = c - g[2] * T
  end
  return c, last
end
-- at brings a bucket (c, t) forward to time x.
local function at(c, t, x)
  if x > t then
    return math.min(full, c + (x - t)), x
  end
  return c, t
end

local c_all, x = run(all)
local c_prev, t_prev = run(prev)
c_prev = at(c_prev, t_prev, x)
local c, t = at(cur_c, cur_t, x)
c = c - (c_prev - c_all)
if c < -full then
  c = -full
end
redis.call('HSET', KEYS[1], 'c', string.format('%d', c), 't', string.format('%d', t))
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local ttl = math.floor((t + full - c - now) / 1000) + 1
if ttl < 1 then
  ttl = 1
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
return {1, c, t}
