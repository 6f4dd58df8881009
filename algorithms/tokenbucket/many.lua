-- holdfast token bucket: several decisions on one key, in order, at one
-- instant of Redis time (driver.Many). Each is what tokenbucket.lua
-- decides alone at that instant; the bucket is read once and written
-- once, with tokenbucket.lua's reading, write and arithmetic (read.lua,
-- write.lua and remaining.lua, put in line by tokenbucket.go; tokenbucket.lua's
-- comments say why each is so), which replay_model_test and CheckMany
-- hold to the Go twin. (driver.NewMany puts now, out and o before this
-- source, and calls one.)
--
-- ARGV[1]  C, capacity in tokens; ARGV[2] T, microseconds a token
-- then for each decision: n, its cost in tokens (1 <= n <= C), and its
-- deadline: "@" and Redis time in us (driver.DeadlineArg), or ""
--
-- Reply: driver.Many's; each decision's as tokenbucket.lua gives it.
-- C and T are read once a call; a call of several keys shares them.
local C, T = tonumber(ARGV[1]), tonumber(ARGV[2])

-- one decides the decisions from first to last on the bucket in key.
local function one(key, first, last)
  if not C or not T or C < 1 or T < 1 then
    return redis.error_reply('ERR holdfast token bucket: bad arguments')
  end
  local full = C * T
  -- #read
  -- Each decision in turn, as decide_each would make them (its layout,
  -- in line: a closure and a call a decision are Redis time). A bad cost
  -- fails the call before anything is written; what was appended to out
  -- is then dropped (driver.NewMany).
  local spent = false
  for i = first, last, EACH + 1 do
    local n = tonumber(ARGV[i])
    if not n or n < 1 or n > C then
      return redis.error_reply('ERR holdfast token bucket: bad arguments')
    end
    local d = ARGV[i + 1]
    if d ~= '' and string.byte(d, 1) == 64 and now > tonumber(string.sub(d, 2)) then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 0, 0, 0, 0, 0
    else
      local need = n * T
      local allowed = credit >= need
      if allowed then
        credit = credit - need
        spent = true
      end
      -- #remaining
      if allowed then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 1, remaining, 0, full - credit, now
      else
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 0, remaining, need - credit, full - credit, now
      end
    end
    o = o + 6
  end
  -- As tokenbucket.lua: E written keeping the key's expiry while it stays
  -- in the quarter of the E the key holds, else with the key's expiry.
  if spent then
    local ne = now - credit
    -- #write
  end
end
