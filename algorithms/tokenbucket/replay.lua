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
-- KEYS[1]  the bucket: one integer E, the instant its credit was (or will
--          be) zero, as in tokenbucket.lua; at time x it holds
--          min(C*T, x - E)
-- KEYS[2]  the batch marker: set in this same call, so a retried batch is a
--          no-op
-- KEYS[3]  the merge log: a list, "base E" then "at cost" per grant
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
-- Reply: {1, credit, t} when applied (the bucket's credit at Redis time t);
--        {0, 0, 0} when the batch was applied before.
-- The marker is checked first and set last: a script that fails midway
-- (Redis does not roll back) leaves no marker, so the retry applies the batch
-- again — at worst counted twice, never lost.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 0, 0}
end
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local full = C * T

-- The bucket's E. A hash {c, t} left by an earlier holdfast is read as
-- E = t - c (SET below overwrites it); any other type is WRONGTYPE.
local cur
local s = redis.pcall('GET', KEYS[1])
if type(s) == 'table' then
  if not s.err or string.sub(s.err, 1, 9) ~= 'WRONGTYPE' then
    return redis.error_reply(s.err or 'ERR holdfast reconcile: GET failed')
  end
  local h = redis.call('HMGET', KEYS[1], 'c', 't')
  local c, t = tonumber(h[1]), tonumber(h[2])
  if not c or not t then
    return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. KEYS[1])
  end
  cur = t - c
elseif s then
  cur = tonumber(s)
  if not cur then
    return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. KEYS[1])
  end
elseif tonumber(ARGV[5]) > 0 then
  cur = tonumber(ARGV[5]) - tonumber(ARGV[4])
else
  cur = -full -- a full bucket at any time since the epoch
end

-- A merge log past MAXLOG entries is not read again: a batch then is charged
-- against the stored bucket alone (conservative), so one call's work stays
-- bounded on a hot key.
local MAXLOG = 2000
-- One read: more than MAXLOG entries back means the log is past the bound;
-- none means there is no log yet (it is created with this batch's grants).
local log = redis.call('LRANGE', KEYS[3], 0, MAXLOG)
local merging = #log <= MAXLOG
local base = cur
local prev, all = {}, {}
local push = {}
if not merging then
  log = {}
elseif #log > 0 then
  local b = string.match(log[1], '^base (%-?%d+)$')
  if b then
    base = tonumber(b)
  else
    -- a log an earlier holdfast started: "base c t"
    local bc, bt = string.match(log[1], '^base (%-?%d+) (%-?%d+)$')
    if not bc then
      return redis.error_reply('ERR holdfast reconcile: corrupt merge log ' .. KEYS[3])
    end
    base = tonumber(bt) - tonumber(bc)
  end
  for i = 2, #log do
    local at, n = string.match(log[i], '^(%-?%d+) (%d+)$')
    if not at then
      return redis.error_reply('ERR holdfast reconcile: corrupt merge log ' .. KEYS[3])
    end
    local g = {tonumber(at), tonumber(n)}
    prev[#prev + 1] = g
    all[#all + 1] = g
  end
else
  push[1] = string.format('base %d', base)
end
local created = #push > 0
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
if created then
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end

local function byTime(a, b)
  return a[1] < b[1]
end
table.sort(prev, byTime)
table.sort(all, byTime)

-- run feeds grants, in time order, to the base bucket and returns its E:
-- at each grant the bucket holds min(full, g - E), so E is at least g - full
-- (a full bucket wastes its refill), and the grant adds its cost.
local function run(grants)
  local e = base
  for _, g in ipairs(grants) do
    if e < g[1] - full then
      e = g[1] - full
    end
    e = e + g[2] * T
  end
  return e
end

local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local e = cur
local x = now
if #all > 0 then
  -- The batch costs, at the latest grant x, the credit the logged bucket
  -- holds without it minus what it holds with it.
  x = all[#all][1]
  local e_all = run(all)
  local e_prev = run(prev)
  if e_prev < x - full then
    e_prev = x - full
  end
  if e < x - full then
    e = x - full
  end
  e = e + (e_all - e_prev)
end
-- A debt of at most one full bucket, now (or at the latest grant when that
-- is later).
if e > math.max(now, x) + full then
  e = math.max(now, x) + full
end
local ttl = math.floor((e + full - now) / 1000) + 1
if ttl < 1 then
  ttl = 1
end
redis.call('SET', KEYS[1], string.format('%d', e), 'PX', string.format('%d', ttl))
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
local c = now - e
if c > full then
  c = full
end
return {1, c, now}
