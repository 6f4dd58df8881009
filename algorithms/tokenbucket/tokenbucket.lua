-- holdfast token bucket: one decision.
--
-- The bucket is kept as "credit": the time, in microseconds, that the bucket
-- has refilled and not spent. One token is worth T microseconds of credit, a
-- full bucket C*T. All numbers stay integers below 2^53, so Lua's doubles and
-- the Go twin agree exactly.
--
-- The key holds ONE integer, E: the instant (Redis time, us) at which the
-- bucket held, or will hold, zero credit. Credit refills one microsecond per
-- microsecond, so at any time x the bucket holds min(C*T, x - E); a bucket
-- updated at t with credit c is stored as E = t - c. One integer is a string
-- Redis keeps INT-encoded: 72 bytes a key (MEMORY USAGE), against 104 for a
-- "c:t" string and 120 for the hash {c, t} this replaced. After a
-- recovery's replay the value may be followed by a merge log
-- ("E|...", replay.lua); the first decision writes E alone again.
--
-- KEYS[1]  the bucket: a string, the decimal E
-- ARGV[1]  C, capacity in tokens
-- ARGV[2]  T, microseconds to refill one token
-- ARGV[3]  n, the request's cost in tokens (1 <= n <= C)
-- ARGV[4]  optional: "now" in us to use instead of Redis TIME (tests, replay)
--
-- Reply: {allowed (0|1), remaining tokens, retry_after_us, reset_after_us,
--         now_us}
--
-- The script stands alone, with no function shared with many.lua: a lone
-- caller's decision is one Redis call of it, and every
-- closure a call creates and every call it makes is Redis time a decision
-- pays (BENCHMARKS.md, section 6's script floor). The reading and the write
-- are read.lua and write.lua, which tokenbucket.go puts in line here and
-- in many.lua, at their #read and #write comments; replay_model_test
-- and the storetest suites hold the two to the Go twin.
-- Arithmetic reads a decimal argument in one parse (tonumber parses it
-- twice, a cost of every decision); an argument that is not a number
-- fails the call with Lua's error, and one out of range with the reply
-- below.
local C, T, n = 0 + ARGV[1], 0 + ARGV[2], 0 + ARGV[3]
if C < 1 or T < 1 or n < 1 or n > C then
  return redis.error_reply('ERR holdfast token bucket: bad arguments')
end
-- NOW: the time the deadline guard read (driver.NewDecisionScript), if it did.
local now = ARGV[4]
if now then
  now = 0 + now
end
if not now or now <= 0 then
  now = NOW
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
end
local key = KEYS[1]
local full = C * T
-- #read
local need = n * T
local allowed = credit >= need
if allowed then
  -- The key holding E lives until the bucket is full again, E + full, and
  -- at most a quarter of full (q, at least 1 ms) longer: to the end of E's
  -- quarter, (floor(E / q) + 1) * q + full, and 1-2 ms more (PX counts
  -- whole milliseconds from Redis's clock), an instant that depends on E's
  -- quarter alone (replay.go's lifeMs; every writer of a key holding E
  -- alone gives it this expiry). A spend moves E forward; while E stays in
  -- the quarter of the E the key holds, the key's expiry is already right
  -- and E is written keeping it (SET KEEPTTL: no PTTL read, Redis's expiry
  -- table untouched). Otherwise, and for a key that held nothing, a merge
  -- log or an old hash, the key is written whole with its expiry (SET PX).
  -- The commands stay those of the ACL operations.md gives.
  -- string.format: a Redis before 7 writes a number argument with %.14g,
  -- and 7.2's shortest form writes one with 8 trailing zeros with an
  -- exponent. PEEK (set before this source: tokenbucket.go) answers
  -- without spending.
  local left = credit - need
  if not PEEK then
    local ne = now - left
    -- #write
  end
  credit = left
end
-- #remaining
if not allowed then
  return {0, remaining, need - credit, full - credit, now}
end
return {1, remaining, 0, full - credit, now}
