-- holdfast token bucket: the reading and the write of several decisions
-- on one key (many.lua). The state is described in tokenbucket.lua, which
-- has the same reading and write in line.

-- (idiv: driver.LuaIDiv, put before this source.)

-- empty reads the bucket's E, or nil when the key holds nothing, and
-- whether the key holds E alone, the decimal integer. A hash
-- {c, t} left by an earlier holdfast is read as E = t - c (the next admit
-- overwrites it with the string); any other type is WRONGTYPE.
local function empty(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    if not v.err or string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then
      return nil, v.err or 'ERR holdfast token bucket: GET failed'
    end
    local h = redis.call('HMGET', key, 'c', 't')
    local c, t = tonumber(h[1]), tonumber(h[2])
    if not c or not t then
      return nil, 'ERR holdfast token bucket: corrupt state in ' .. key
    end
    return t - c
  end
  if not v then
    return nil
  end
  local e = tonumber(v)
  if e then
    return e, nil, true
  end
  -- E and a recovery's merge log after it (replay.lua).
  e = tonumber(string.match(v, '^(%-?%d+)|'))
  if not e then
    return nil, 'ERR holdfast token bucket: corrupt state in ' .. key
  end
  return e
end

-- credit_at returns the credit the bucket in key holds at now, when a full
-- bucket holds full (a key that holds nothing is a full bucket), and
-- whether the key holds E alone with less than full credit: a spend then
-- keeps the key's expiry (spend); or nil and an error.
local function credit_at(key, now, full)
  local e, err, plain = empty(key)
  if err then
    return nil, err
  end
  if not e then
    return full
  end
  local credit = now - e
  if credit >= full then
    return full
  end
  return credit, nil, plain
end

-- spend writes the bucket in key after a spend left it credit at now
-- (read by credit_at, with its plain). The key must live until the bucket
-- is full again, full - credit from now; it lives up to a quarter of full
-- longer, so that spends in a row seldom have to move its expiry. A key
-- that holds E alone with less than full credit keeps its expiry while E
-- is written (SET KEEPTTL), which is read and moved only when it falls
-- short (PTTL is a read; a key without an expiry gets one). Any other key
-- is written whole: E alone, and an expiry. (The commands stay those of
-- the ACL operations.md gives: SET, PTTL, PEXPIRE.)
local function spend(key, now, full, credit, plain)
  local must = full - credit
  -- string.format: a Redis before 7 writes a number argument with %.14g,
  -- which turns a microsecond instant into an exponent.
  local e = string.format('%d', now - credit)
  if plain then
    redis.call('SET', key, e, 'KEEPTTL')
    -- 2 ms: PTTL counts whole milliseconds from the script's start.
    if redis.call('PTTL', key) * 1000 >= must + 2000 then
      return
    end
    redis.call('PEXPIRE', key, string.format('%d', math.floor((must + idiv(full, 4)) / 1000) + 2))
    return
  end
  redis.call('SET', key, e, 'PX', string.format('%d', math.floor((must + idiv(full, 4)) / 1000) + 2))
end
