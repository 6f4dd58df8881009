-- holdfast sliding window counter: several decisions on one key, in
-- order, at one instant of Redis time (driver.Many). Each is what
-- slidingcounter.lua decides alone at that instant; the counter is read
-- once and written once.
-- (driver.NewMany puts now and out before this source, and calls one;
-- driver.LuaManyHelpers' costs_ok and decide_each and counter.lua's idiv,
-- read and judge come first.)
--
-- ARGV[1]  L, the limit in units per window; ARGV[2] W, the window in us
-- then for each decision: n, its cost in units (1 <= n <= L), and its
-- deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: driver.Many's; each decision's as slidingcounter.lua gives it.
-- L and W are read once a call; a call of several keys shares them.
local L, W = tonumber(ARGV[1]), tonumber(ARGV[2])

-- one decides the decisions from first to last on the counter in key.
local function one(key, first, last)
  if not L or not W or L < 1 or W < 1 or not costs_ok(L, first, last) then
    return redis.error_reply('ERR holdfast sliding window counter: bad arguments')
  end
  local k, c, p = read(key, now, L, W)
  if not k then
    return redis.error_reply(c)
  end
  local life
  decide_each(first, last, function(i)
    local ok, c2, remaining, retry, reset = judge(L, W, now, k, c, p, tonumber(ARGV[i]))
    if ok then
      c, life = c2, reset
      return 1, remaining, 0, reset, now
    end
    return 0, remaining, retry, reset, now
  end)
  -- As slidingcounter.lua: the key lives until both counts have left the window.
  if life then
    redis.call('SET', key, string.format('%d:%d:%d', k, c, p), 'PX', string.format('%d', math.floor(life / 1000) + 1))
  end
end
