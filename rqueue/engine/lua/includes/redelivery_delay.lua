--[[
  The delay (ms) before the count-th delivery's redelivery under the failure
  policy (includes/group_args.lua), as Artemis's: delay x
  multiplier^(count-1), capped at maxDelay, then +/- delay x jitter x
  random. One random number comes per call; each seq derives its own from it
  so a batch does not move in step.
]]
local GOLDEN = 0.6180339887498949

local function redeliveryDelay(policy, count, seq)
  if policy.delay <= 0 then
    return 0
  end
  local d = policy.delay * policy.multiplier ^ (count - 1)
  if d > policy.maxDelay then
    d = policy.maxDelay
  end
  if policy.jitter > 0 then
    local r = (policy.random + seq * GOLDEN) % 1
    d = d + d * policy.jitter * (2 * r - 1)
  end
  return math.floor(d + 0.5)
end
