-- holdfast token bucket: the write of the bucket's new E, ne, put in line
-- by tokenbucket.go at the #write comment of tokenbucket.lua and many.lua. It
-- needs key, now, full, plain (read.lua) and ne in scope: the expiry of
-- tokenbucket.lua's comment, the key's kept while ne stays in the quarter
-- of the E it holds.
-- Integer divisions by %, which Lua computes in its VM (a % b = a -
-- floor(a / b) * b): no call of math.floor, each a C function call
-- that a decision paid four times. q = floor(full / 4), at least
-- 1000; bq = floor(ne / q) * q, the start of ne's quarter (a
-- remainder below 0 is a quotient that rounded up to an integer,
-- which needs values past 2^53: the check keeps the result exact
-- whatever the inputs). ms > 0: bq + q > ne >= now - full.
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
