--[[
  Offers a message again: ready now (a redelivery, ahead of new messages),
  or after delayMs (ms) in the delay set.
]]
--@include group_keys
--@include group_names
--@include group_args
local function requeue(seq, delayMs)
  if delayMs > 0 then
    rcall('ZADD', delayKey, now + delayMs, seq)
  else
    rcall('ZADD', readyKey, seq, seq)
  end
end
