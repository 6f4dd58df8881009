-- holdfast sliding window log: what one decision (slidingwindow.lua) and
-- several on one key (many.lua) share. The log is described in
-- slidingwindow.lua.

-- denied is the reply to a cost n that does not fit the count units in
-- the window of key at now.
local function denied(key, L, W, now, count, n)
  -- The k-th oldest unit must leave the window before n more fit.
  local k = count + n - L
  local kth = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local remaining = L - count
  if remaining < 0 then
    remaining = 0
  end
  return {0, remaining, tonumber(kth[2]) + W - now, tonumber(newest[2]) + W - now, now}
end

-- add adds a cost n of request id to the log in key at now: members id,
-- id#1, ..., id#(n-1), scored now. It returns how many were new.
local function add(key, now, n, id)
  local z = {}
  local score = string.format('%d', now)
  for i = 0, n - 1 do
    z[#z + 1] = score
    if i == 0 then
      z[#z + 1] = id
    else
      z[#z + 1] = id .. '#' .. i
    end
  end
  return redis.call('ZADD', key, unpack(z))
end
