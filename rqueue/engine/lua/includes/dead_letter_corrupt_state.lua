--[[
  A message whose delivery state does not parse: moved aside, byte for
  byte, so that it neither blocks the group nor is lost (reason
  "corrupted-state"). raw is the state as read.
]]
--@include group_keys
--@include group_names
--@include group_args
--@include dead_letter
local function deadLetterCorruptState(seq, raw)
  failurePolicy() -- before the ZREM, as in deadLetter
  rcall('ZREM', leaseKey, seq)
  local d = {count = 0, holder = '', first = '', last = '', past = ''}
  deadLetter(seq, d, 'corrupted-state', 'delivery state does not parse: ' .. string.sub(raw, 1, 200))
end
