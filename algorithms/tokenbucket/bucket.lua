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
-- bucket holds full (a key that holds nothing is a full bucket), and the
-- key's E when it holds E alone (for spend); or nil and an error.
local function credit_at(key, now, full)
  local e, err, plain = empty(key)
  if err then
    return nil, err
  end
  if not e then
    return full
  end
  local credit = now - e
  if credit > full then
    credit = full
  end
  if plain then
    return credit, nil, e
  end
  return credit
end

-- spend writes the bucket in key after a spend left it credit at now
-- (read by credit_at, with its plain E), with tokenbucket.lua's expiry:
-- to the end of E's quarter, q a quarter of full (at least 1 ms). A key
-- that held E alone in the same quarter keeps its expiry (SET KEEPTTL);
-- any other key is written whole (SET PX life_ms, put before this source
-- with driver.LuaIDiv). string.format: see tokenbucket.lua.
local function spend(key, now, full, credit, plain)
  local e = now - credit
  local q = math.max(math.floor(full / 4), 1000)
  if plain and idiv(plain, q) == idiv(e, q) then
    redis.call('SET', key, string.format('%d', e), 'KEEPTTL')
    return
  end
  redis.call('SET', key, string.format('%d', e), 'PX', life_ms(e, full, now))
end
