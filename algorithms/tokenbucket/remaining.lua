-- holdfast token bucket: the tokens left in credit, put in line by
-- tokenbucket.go at the #remaining comment of tokenbucket.lua and
-- many.lua. It needs credit and T in scope and leaves remaining:
-- floor(credit / T) for credit above 0, else 0, by % as write.lua divides:
-- credit - r is a multiple of T, so the division is exact even where
-- credit / T rounds.
local remaining = 0
if credit > 0 then
  local r = credit % T
  if r < 0 then
    r = r + T
  end
  remaining = (credit - r) / T
end
