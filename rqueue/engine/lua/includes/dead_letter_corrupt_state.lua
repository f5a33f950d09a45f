--[[
  A message whose delivery state does not parse: moved aside, byte for
  byte, so that it neither blocks the group nor is lost (reason
  "corrupted-state"). raw is the state as read; false or nil when it is
  missing though the message is leased (deleted).
]]
--@include group_keys
--@include group_names
--@include group_args
--@include dead_letter
local function deadLetterCorruptState(seq, raw)
  failurePolicy() -- before the ZREM, as in deadLetter
  deadLetterSeqFree()
  rcall('ZREM', leaseKey, seq)
  local d = {count = 0, holder = '', first = '', last = '', past = ''}
  local what = 'delivery state does not parse: ' .. string.sub(raw or '', 1, 200)
  if not raw then
    what = 'delivery state of seq ' .. seq .. ' is missing from ' .. dlvKey .. ', though it is leased'
  end
  return deadLetter(seq, d, 'corrupted-state', what)
end
