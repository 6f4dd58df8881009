-- holdfast sliding window log: several decisions on one key, in order, at
-- one instant of Redis time (driver.Many). Each is what slidingwindow.lua
-- decides alone at that instant; the log is trimmed and counted once.
-- (driver.NewMany puts now and out before this source, and calls one;
-- driver.LuaManyHelpers' costs_ok and decide_each and window.lua's denied
-- and add come first.)
--
-- ARGV[1]  L, the limit in units per window; ARGV[2] W, the window in us
-- then for each decision: n, its cost (1 <= n <= L), its unique id, and
-- its deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: driver.Many's; each decision's as slidingwindow.lua gives it.
-- L and W are read once a call; a call of several keys shares them.
local L, W = tonumber(ARGV[1]), tonumber(ARGV[2])

-- one decides the decisions from first to last on the window in key.
local function one(key, first, last)
  if not L or not W or L < 1 or W < 1 or not costs_ok(L, first, last) then
    return redis.error_reply('ERR holdfast sliding window: bad arguments')
  end
  for i = first + 1, last, EACH + 1 do
    if ARGV[i] == '' then
      return redis.error_reply('ERR holdfast sliding window: bad arguments')
    end
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - W))
  local count = redis.call('ZCARD', key)
  local added = false
  decide_each(first, last, function(i)
    local n = tonumber(ARGV[i])
    if count + n > L then
      return unpack(denied(key, L, W, now, count, n))
    end
    local before = count
    count = count + add(key, now, n, ARGV[i + 1])
    added = true
    return 1, L - before - n, 0, W, now
  end)
  -- As slidingwindow.lua: the key lives until the units added leave the window.
  if added then
    redis.call('PEXPIRE', key, math.floor(W / 1000) + 1)
  end
end
