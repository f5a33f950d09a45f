--[[
  The common ack of one message: when ARGV[first], ARGV[first + 1],
  ARGV[first + 2] is the only tag and it is this consumer's current
  delivery (its token included) with no history, it
  is settled with the commands ackTags (includes/ack_tags.lua) would send,
  in the same order, without a batch's lists and tables. Returns {"ok"};
  nil, having changed nothing, for any other tag or more than one.
  Callers try this first and include the batch path after it: a function
  is built anew by every call that reaches its definition, so a call that
  returns here never builds checkTag, ackTags or the delivery states'.
]]
--@include group_keys
--@include group_names
--@include settle
local function ackHeldOne(first)
  local field, countArg, tokenArg = ARGV[first], ARGV[first + 1], ARGV[first + 2]
  if #ARGV ~= first + 2 or #tokenArg > 32 or not string.find(tokenArg, '^%l[%l%d]*$') then
    return nil -- a malformed token goes the long way, to be named (check_tag.lua)
  end
  --@layout stream
  if string.byte(countArg, 1) == 114 then -- 114: 'r', a range (includes/ack_ranges.lua)
    return nil
  end
  --@end
  local raw = rcall('HGET', dlvKey, field)
  if not raw then
    --@layout stream
    if callsKey and countArg == '1' then
      -- A call's own delivery (includes/call_state.lua).
      --@make callPaths
      return ackCallOne(field, tokenArg)
    end
    --@end
    return nil
  end
  local held = countArg .. ':' .. consumerName .. ':'
  if string.sub(raw, 1, #held) ~= held then
    return nil
  end
  local _, times = string.find(raw, '^%d+:%d+:', #held + 1)
  if times == nil or string.sub(raw, times + 1) ~= tokenArg then
    return nil
  end
  local floor = ackFloor() -- before any write (includes/settle.lua)
  rcall('ZREM', leaseKey, field)
  rcall('HINCRBY', consumersKey, consumerName, '-1')
  rcall('HDEL', dlvKey, field)
  settleMany({field + 0}, {field}, floor)
  rcall('HINCRBY', groupKey, 'acked', '1')
  return {'ok'}
end
