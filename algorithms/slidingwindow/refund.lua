-- holdfast sliding window log: give back an admission (core.Refunder).
--
-- Removes the n members the admission added: id, id#1, ..., id#(n-1).
--
-- KEYS[1]  the window (slidingwindow.lua)
-- ARGV[1]  n, the admission's cost
-- ARGV[2]  its admission time in us (used by the Go twin, which keeps times)
-- ARGV[3]  its request id
--
-- Reply: {members removed}
local n = tonumber(ARGV[1])
local id = ARGV[3]
if not n or n < 1 or n > 1000000 or not id or id == '' then
  return redis.error_reply('ERR holdfast sliding window refund: bad arguments')
end
local m = {id}
for i = 1, n - 1 do
  m[#m + 1] = id .. '#' .. i
end
return {redis.call('ZREM', KEYS[1], unpack(m))}
