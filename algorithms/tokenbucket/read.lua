-- holdfast token bucket: the reading of the bucket, put in line by
-- tokenbucket.go at the #read comment of tokenbucket.lua and many.lua (a
-- function a decision called would be Redis time it pays). It needs key,
-- now and full in scope, and leaves credit and plain; it returns an error
-- reply, having written nothing, for a key it cannot read.
-- The bucket's credit at now (a key that holds nothing is a full bucket),
-- and plain: the key's E when it holds E alone (false otherwise).
local credit, plain = full, false
local v = redis.pcall('GET', key)
if v then
  local e = tonumber(v)
  if e then
    plain = e
  elseif type(v) == 'table' then
    -- A hash {c, t} left by an earlier holdfast is read as E = t - c (the
    -- next admit overwrites it with the string); any other type is
    -- WRONGTYPE.
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
    -- E and a recovery's merge log after it (replay.lua).
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
