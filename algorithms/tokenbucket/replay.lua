-- holdfast token bucket reconciliation: fold one batch of grants that an
-- instance admitted during an outage into the shared bucket, charging the
-- batch its MARGINAL cost in one global bucket. This is the body of
-- driver.NewReplayScript's replay(key, i, n, fresh), which runs it once per
-- batch and keeps the markers that make a batch count once.
--
-- The first batch of a recovery records the bucket as it stood (the base)
-- in a merge log; every batch adds its grants to the log. The bucket fed
-- all logged grants in time order (refilling between grants, capped at
-- capacity) is computed with and without this batch's grants; the
-- difference, at the latest grant time, is what this batch costs, and is
-- charged to the stored bucket. Instances reconciling one after another
-- thus end exactly where one global bucket fed all their grants would be,
-- whatever their order; decisions Redis made meanwhile stay counted. The
-- balance may become a debt, of at most one full bucket.
--
-- The merge log is kept in the bucket's own value, after its E:
--
--   E|S|B|at|cost|at|cost...
--
-- S is the Redis time of the log's first batch and B the base (the
-- bucket's E before it). A decision (tokenbucket.lua) reads the E before
-- the first '|' and writes E alone, so the first decision through Redis
-- ends the merge, as it must: the log does not hold that decision's spend.
-- A log older than the merge window is not read either. One key holds it
-- all, so a replay writes one key; the first batch of a key costs one GET
-- and one SET.
--
-- key        the bucket (tokenbucket.lua)
-- fresh      true when key does not exist (driver.NewReplayScript)
-- shared[1]  T, microseconds to refill one token
-- shared[2]  F = C*T, a full bucket's credit in microseconds
-- shared[3]  the merge window in microseconds: how long after its first
--            batch a merge log is read
-- ARGV[i]    seed credit (us) and ARGV[i+1] seed time (us; 0: no seed):
--            the instance's last known state of the bucket, used only when
--            the key is missing (Redis restarted empty, or the key expired
--            when full: refilling from the seed gives the same full bucket)
-- ARGV[i+2]  m, the number of grants (0: a restore, see below), and
--            ARGV[i+3] x, the latest grant's time (us, Redis clock; for a
--            restore, driver.Batch.Since)
-- ARGV[i+4]  S and ARGV[i+5] A: the batch fed alone to a bucket whose E is
--            e leaves it at max(e + S, A) (S = T * the grants' cost; A = the
--            most, over grants k, of at_k - F + T * the cost of grants k
--            and later): what the loop of run below makes of the grants,
--            computed by ReplayArgs
-- ARGV[i+6]  the grants, "at|cost|at|cost...", in time order
--
-- Reply: {1, credit, now}: the bucket's credit at Redis time now.
-- Arithmetic reads a decimal argument in one parse (Lua 5.1's tonumber
-- parses it twice); ReplayArgs writes only decimals.
local full = shared[2]
local x = 0 + ARGV[i + 3]
local m = 0 + ARGV[i + 2]
if m == 0 then
  -- A batch of no grants is a restore (driver.Batch.Since), after Redis
  -- lost its data: x is a Redis time no later than the loss. A missing
  -- key gets the seed's bucket, unless it would be full again by now. A
  -- key that exists holds only what was decided since x, from a full
  -- bucket: the seed's debt against a full bucket at x is added to it.
  -- (A key made later than x was full later: the charge errs high, by at
  -- most the refill between x and the loss.)
  local at = 0 + ARGV[i + 1]
  if at <= 0 then
    return {1, 0, now}
  end
  local e = at - ARGV[i]
  local s = false
  if not fresh then
    s = redis.call('GET', key) -- another type: WRONGTYPE, which the restore skips
  end
  local ttl, rest
  if not s then
    if e + full <= now then
      return {1, 0, now}
    end
  else
    local add = e + full - x
    local v = tonumber(s)
    if not v then
      local ev
      ev, rest = string.match(s, '^(%-?%d+)|(.*)$')
      v = tonumber(ev)
    end
    if x <= 0 or add <= 0 or not v then
      return {1, 0, now}
    end
    if v < now - full then
      v = now - full
    end
    e = v + add
    if e > now + full then
      e = now + full
    end
  end
  local value = string.format('%d', e)
  if not rest then
    -- E alone, living to the end of its quarter (life_ms: luaLife).
    redis.call('SET', key, value, 'PX', life_ms(e, full, now))
    return {1, 0, now}
  end
  -- A recovery's merge log is kept, and lives as long as it did.
  ttl = math.floor((e + full - now) / 1000) + 1
  value = value .. '|' .. rest
  local pttl = redis.call('PTTL', key)
  if pttl > ttl then
    ttl = pttl
  end
  redis.call('SET', key, value, 'PX', string.format('%d', ttl))
  return {1, 0, now}
end

-- The bucket's E, and the merge log after it. A hash {c, t} left by an
-- earlier holdfast is read as E = t - c (SET below overwrites it); any
-- other type is WRONGTYPE.
local cur, log
local s = false
if not fresh then
  s = redis.pcall('GET', key)
end
if type(s) == 'table' then
  if not s.err or string.sub(s.err, 1, 9) ~= 'WRONGTYPE' then
    return redis.error_reply(s.err or 'ERR holdfast reconcile: GET failed')
  end
  local h = redis.call('HMGET', key, 'c', 't')
  local c, t = tonumber(h[1]), tonumber(h[2])
  if not c or not t then
    return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. key)
  end
  cur = t - c
elseif s then
  cur = tonumber(s)
  if not cur then
    local e, rest = string.match(s, '^(%-?%d+)|(.*)$')
    cur = tonumber(e)
    if not cur then
      return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. key)
    end
    log = rest
  end
elseif 0 + ARGV[i + 1] > 0 then
  cur = ARGV[i + 1] - ARGV[i]
else
  cur = -full -- a full bucket at any time since the epoch
end

-- A merge log past MAXLOG grants is dropped: the next batch then starts a
-- new one from the stored bucket (conservative), so one call's work stays
-- bounded on a hot key.
local MAXLOG = 2000
local window = shared[3]
local start, base = now, cur
local prev, np = nil, 0
if log then
  local ls, lb, entries = string.match(log, '^(%-?%d+)|(%-?%d+)(.*)$')
  if not ls then
    return redis.error_reply('ERR holdfast reconcile: corrupt merge log in ' .. key)
  end
  if now - tonumber(ls) <= window then
    start, base, prev = tonumber(ls), tonumber(lb), {}
    for at, c in string.gmatch(entries, '|(%-?%d+)|(%d+)') do
      np = np + 1
      prev[np] = {tonumber(at), tonumber(c)}
    end
  else
    log = nil
  end
end

-- run feeds grants, in time order, to the base bucket and returns its E:
-- at each grant the bucket holds min(full, g - E), so E is at least g - full
-- (a full bucket wastes its refill), and the grant adds its cost.
local e
if not prev then
  -- The first batch of the merge: it costs what it spends of the stored
  -- bucket, whose E is the base.
  e = cur + ARGV[i + 4]
  local a = 0 + ARGV[i + 5]
  if e < a then
    e = a
  end
else
  local T = shared[1]
  local function run(grants)
    local r = base
    for _, g in ipairs(grants) do
      if r < g[1] - full then
        r = g[1] - full
      end
      r = r + g[2] * T
    end
    return r
  end
  local function byTime(a, b)
    return a[1] < b[1]
  end
  table.sort(prev, byTime)
  local all = {}
  for k = 1, np do
    all[k] = prev[k]
  end
  for at, c in string.gmatch('|' .. ARGV[i + 6], '|(%-?%d+)|(%d+)') do
    all[#all + 1] = {tonumber(at), tonumber(c)}
  end
  table.sort(all, byTime)
  -- The batch costs, at the latest grant x, the credit the logged bucket
  -- holds without it minus what it holds with it.
  x = all[#all][1]
  local e_all, e_prev = run(all), run(prev)
  if e_prev < x - full then
    e_prev = x - full
  end
  e = cur
  if e < x - full then
    e = x - full
  end
  e = e + (e_all - e_prev)
end
-- A debt of at most one full bucket, now (or at the latest grant when that
-- is later).
local late = now
if x > late then
  late = x
end
if e > late + full then
  e = late + full
end

if np + m > MAXLOG then
  -- E alone, living to the end of its quarter (life_ms: luaLife).
  redis.call('SET', key, string.format('%d', e), 'PX', life_ms(e, full, now))
else
  -- The key lives until the bucket is full again, and while the log is
  -- read.
  local value
  if log then
    value = string.format('%d|', e) .. log .. '|' .. ARGV[i + 6]
  else
    value = string.format('%d|%s|%d|', e, nowS, base) .. ARGV[i + 6]
  end
  local ttl = math.max(math.floor((e + full - now) / 1000) + 1, math.floor((start + window - now) / 1000) + 1, 1)
  redis.call('SET', key, value, 'PX', string.format('%d', ttl))
end
local c = now - e
if c > full then
  c = full
end
return {1, c, now}
