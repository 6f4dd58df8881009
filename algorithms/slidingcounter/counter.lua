-- holdfast sliding window counter: what one decision (slidingcounter.lua)
-- and several on one key (many.lua) share. The state is described in
-- slidingcounter.lua.

-- (idiv: driver.LuaIDiv, put before this source.)

-- read returns the counter in key as of now's window: its window k, its
-- count c and the previous window's p; or nil and an error. A window ago
-- the current count becomes the previous one; two windows ago both are
-- gone.
local function read(key, now, L, W)
  local j = idiv(now, W)
  local k, c, p = j, 0, 0
  local v = redis.call('GET', key)
  if v then
    local sk, sc, sp = string.match(v, '^(%d+):(%d+):(%d+)$')
    if not sk then
      return nil, 'ERR holdfast sliding window counter: corrupt state in ' .. key
    end
    sk, sc, sp = tonumber(sk), tonumber(sc), tonumber(sp)
    if sk >= j then
      k, c, p = sk, sc, sp
    elseif sk == j - 1 then
      p = sc
    end
  end
  if c > 2 * L then
    c = 2 * L
  end
  if p > 2 * L then
    p = 2 * L
  end
  return k, c, p
end

-- judge decides a cost n on the counter (k, c, p) at now. It returns
-- whether n is admitted, the count c after it, and the reply's remaining
-- units, retry and reset times; admitted, the reset time is also how long
-- the key must live.
local function judge(L, W, now, k, c, p, n)
  local start = k * W
  local e = 0
  if now > start then
    e = now - start
  end
  -- The previous window's weighted count, rounded up.
  local pw = idiv(p * (W - e) + W - 1, W)
  if c + n + pw <= L then
    c = c + n
    -- The key lives until both counts have left the window: reset time.
    return true, c, L - c - pw, 0, start + 2 * W - now
  end
  -- Denied. The same cost fits once p * (W - e') <= (L - c - n) * W in
  -- this window, or else once c * (W - e') <= (L - n) * W in the next.
  local retry
  local e1 = W
  local room = L - c - n
  if p > 0 and room >= 0 then
    e1 = W - idiv(room * W, p)
  end
  if e1 < W then
    retry = start + e1 - now
  else
    local e2 = 0
    if c > 0 then
      e2 = W - idiv((L - n) * W, c)
      if e2 < 0 then
        e2 = 0
      end
    end
    retry = start + W + e2 - now
  end
  local reset = 0
  if c > 0 then
    reset = start + 2 * W - now
  elseif p > 0 then
    reset = start + W - now
  end
  local remaining = L - c - pw
  if remaining < 0 then
    remaining = 0
  end
  return false, c, remaining, retry, reset
end
