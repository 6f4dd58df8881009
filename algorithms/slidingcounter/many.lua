-- holdfast sliding window counter: several decisions on one key, in
-- order, at one instant of Redis time (driver.Many). Each is what
-- slidingcounter.lua decides alone at that instant; the counter is read
-- once and written once.
-- (counter.lua, put before this source, defines read and judge.)
--
-- KEYS[1]  the counter
-- ARGV[1]  L, the limit in units per window; ARGV[2] W, the window in us
-- then for each decision: n, its cost in units (1 <= n <= L), and its
-- deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: for each decision six integers: 0 and slidingcounter.lua's
-- reply, or 1 and five zeros for a decision whose deadline had passed (not
-- decided).
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
if not L or not W or L < 1 or W < 1 then
  return redis.error_reply('ERR holdfast sliding window counter: bad arguments')
end
for i = 3, #ARGV, 2 do
  local n = tonumber(ARGV[i])
  if not n or n < 1 or n > L then
    return redis.error_reply('ERR holdfast sliding window counter: bad arguments')
  end
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k, c, p = read(KEYS[1], now, L, W)
if not k then
  return redis.error_reply(c)
end
local out, o, life = {}, 0, nil
for i = 3, #ARGV, 2 do
  local d = ARGV[i + 1]
  if d ~= '' and now > tonumber(string.sub(d, 2)) then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 0, 0, 0, 0, 0
  else
    local ok, c2, remaining, retry, reset = judge(L, W, now, k, c, p, tonumber(ARGV[i]))
    if ok then
      c, life = c2, reset
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 1, remaining, 0, reset, now
    else
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 0, remaining, retry, reset, now
    end
  end
  o = o + 6
end
-- As slidingcounter.lua: the key lives until both counts have left the window.
if life then
  redis.call('SET', KEYS[1], string.format('%d:%d:%d', k, c, p), 'PX', string.format('%d', math.floor(life / 1000) + 1))
end
return out
