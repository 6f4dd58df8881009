-- holdfast token bucket: several decisions on one key, in order, at one
-- instant of Redis time (driver.Many). Each is what tokenbucket.lua
-- decides alone at that instant; the bucket is read once and written
-- once, with tokenbucket.lua's reading, write and arithmetic (its
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
  -- The bucket's credit at now (a key that holds nothing is a full
  -- bucket), and plain: the key's E when it holds E alone (false
  -- otherwise).
  local credit, plain = full, false
  local v = redis.pcall('GET', key)
  if v then
    local e = tonumber(v)
    if e then
      plain = e
    elseif type(v) == 'table' then
      if not v.err or string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then
        return redis.error_reply(v.err or 'ERR holdfast token bucket: GET failed')
      end
      local h = redis.call('HMGET', key, 'c', 't')
      local c, t = tonumber(h[1]), tonumber(h[2])
      if not c or not t then
        return redis.error_reply('ERR holdfast token bucket: corrupt state in ' .. key)
      end
      e = t - c
    else
      e = tonumber(string.match(v, '^(%-?%d+)|'))
      if not e then
        return redis.error_reply('ERR holdfast token bucket: corrupt state in ' .. key)
      end
    end
    credit = now - e
    if credit > full then
      credit = full
    end
  end
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
      if credit < need then
        local remaining = 0
        if credit > 0 then
          local r = credit % T
          if r < 0 then
            r = r + T
          end
          remaining = (credit - r) / T
        end
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 0, remaining, need - credit, full - credit, now
      else
        credit = credit - need
        spent = true
        local r = credit % T
        if r < 0 then
          r = r + T
        end
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 1, (credit - r) / T, 0, full - credit, now
      end
    end
    o = o + 6
  end
  -- As tokenbucket.lua: E written keeping the key's expiry while it stays
  -- in the quarter of the E the key holds, else with the key's expiry.
  if spent then
    local ne = now - credit
    local q = (full - full % 4) / 4
    if q < 1000 then
      q = 1000
    end
    local r = ne % q
    if r < 0 then
      r = r + q
    end
    local bq = ne - r
    if plain and plain >= bq then
      redis.call('SET', key, string.format('%d', ne), 'KEEPTTL')
    else
      local ms = bq + q + full - now
      redis.call('SET', key, string.format('%d', ne), 'PX', string.format('%d', (ms - ms % 1000) / 1000 + 2))
    end
  end
end
