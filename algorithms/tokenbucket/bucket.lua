-- holdfast token bucket: what one decision (tokenbucket.lua) and several
-- on one key (many.lua) share. The state is described in tokenbucket.lua.

-- (idiv: driver.LuaIDiv, put before this source.)

-- empty reads the bucket's E, or nil when the key holds nothing. A hash
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
  if not e then
    -- E and a recovery's merge log after it (replay.lua).
    e = tonumber(string.match(v, '^(%-?%d+)|'))
    if not e then
      return nil, 'ERR holdfast token bucket: corrupt state in ' .. key
    end
  end
  return e
end

-- credit_at returns the credit the bucket in key holds at now, when a full
-- bucket holds full (a key that holds nothing is a full bucket); or nil
-- and an error.
local function credit_at(key, now, full)
  local e, err = empty(key)
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
  return credit
end
