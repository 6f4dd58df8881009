-- holdfast sliding window counter reconciliation: fold one batch of grants
-- that an instance admitted during an outage into the shared counter. This
-- is the body of driver.NewReplayScript's replay(key, i, n, fresh), which
-- runs it once per batch and keeps the markers that make a batch count
-- once.
--
-- Each grant counts in the fixed window its ORIGINAL time falls in: added
-- to the current window's count when that is now's window (or later: a
-- grant Redis's clock has not reached yet counts now), to the previous
-- window's count when it is the window before, and skipped when it is
-- older (it has left every window the counter still weighs). The counts are
-- kept at most 2L, as slidingcounter.lua reads them: an outage that
-- admitted more than two limits' worth in one window is forgiven the rest,
-- as a token bucket's debt stops at one bucket.
--
-- key      the counter: a string "k:c:p", as in slidingcounter.lua
-- fresh    true when key does not exist (driver.NewReplayScript)
-- shared[1]  L, the limit in units per window
-- shared[2]  W, the window in microseconds
-- ARGV[i]  seed count and ARGV[i+1] seed time (us; 0: no seed): the
--          instance's last known count (the estimate Redis last reported)
--          and its time; used only when the key is missing (Redis restarted
--          empty, or the key expired) or the batch has no grants (n == 2: a
--          restore after Redis lost its data, driver.Batch.Since, whose key
--          counts only what was decided since), counted in the window of
--          its time like a grant
-- ARGV[i+2], ARGV[i+3], ...  up to ARGV[i+n-1]: pairs of grant time (us,
--          Redis clock) and cost
--
-- Reply: {1, units counted}.
-- (idiv: driver.LuaIDiv, in every replay script.)

-- Arithmetic reads a decimal argument in one parse (Lua 5.1's tonumber
-- parses it twice); ReplayArgs writes only decimals.
local L = shared[1]
local W = shared[2]
local k, c, p = idiv(now, W), 0, 0
local added = 0
-- count adds n units at time at to the window they fall in.
local function count(at, n)
  local g = idiv(at, W)
  if g >= k then
    c = c + n
  elseif g == k - 1 then
    p = p + n
  else
    return
  end
  added = added + n
end
local v = false
if not fresh then
  v = redis.call('GET', key)
end
if v then
  local sk, sc, sp = string.match(v, '^(%d+):(%d+):(%d+)$')
  if not sk then
    return redis.error_reply('ERR holdfast reconcile: corrupt state in ' .. key)
  end
  sk, sc, sp = tonumber(sk), tonumber(sc), tonumber(sp)
  if sk >= k then
    k, c, p = sk, sc, sp
  elseif sk == k - 1 then
    p = sc
  end
end
if (not v or n == 2) and 0 + ARGV[i + 1] > 0 and 0 + ARGV[i] > 0 then
  count(0 + ARGV[i + 1], 0 + ARGV[i])
end
for j = i + 2, i + n - 1, 2 do
  count(0 + ARGV[j], 0 + ARGV[j + 1])
end
if added > 0 then
  if c > 2 * L then
    c = 2 * L
  end
  if p > 2 * L then
    p = 2 * L
  end
  -- The key lives until the end of the next window, as a decision leaves it.
  local life = (k + 2) * W - now
  redis.call('SET', key, string.format('%d:%d:%d', k, c, p), 'PX', string.format('%d', math.floor(life / 1000) + 1))
end
return {1, added}
