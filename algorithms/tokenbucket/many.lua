-- holdfast token bucket: several decisions on one key, in order, at one
-- instant of Redis time (driver.Many). Each is what tokenbucket.lua
-- decides alone at that instant; the bucket is read once and written once.
-- (bucket.lua, put before this source, defines empty and credit_at.)
--
-- KEYS[1]  the bucket
-- ARGV[1]  C, capacity in tokens; ARGV[2] T, microseconds a token
-- then for each decision: n, its cost in tokens (1 <= n <= C), and its
-- deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: for each decision six integers: 0 and tokenbucket.lua's reply, or
-- 1 and five zeros for a decision whose deadline had passed (not decided).
local C = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
if not C or not T or C < 1 or T < 1 then
  return redis.error_reply('ERR holdfast token bucket: bad arguments')
end
for i = 3, #ARGV, 2 do
  local n = tonumber(ARGV[i])
  if not n or n < 1 or n > C then
    return redis.error_reply('ERR holdfast token bucket: bad arguments')
  end
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local full = C * T
local credit, err = credit_at(KEYS[1], now, full)
if err then
  return redis.error_reply(err)
end
local out, o, spent = {}, 0, false
for i = 3, #ARGV, 2 do
  local d = ARGV[i + 1]
  if d ~= '' and now > tonumber(string.sub(d, 2)) then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 0, 0, 0, 0, 0
  else
    local need = tonumber(ARGV[i]) * T
    if credit < need then
      local remaining = 0
      if credit > 0 then
        remaining = idiv(credit, T)
      end
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 0, remaining, need - credit, full - credit, now
    else
      credit = credit - need
      spent = true
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 1, idiv(credit, T), 0, full - credit, now
    end
  end
  o = o + 6
end
-- As tokenbucket.lua: the key lives until the bucket is full again.
if spent then
  redis.call('SET', KEYS[1], string.format('%d', now - credit), 'PX', string.format('%d', math.floor((full - credit) / 1000) + 1))
end
return out
