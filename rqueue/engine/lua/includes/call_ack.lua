--[[
  The ack of a call's own delivery when it is the call's only tag, as
  includes/ack_held_one.lua settles a state (includes/call_state.lua has
  the record's form).
]]
--@include group_keys
--@include group_names
--@include settle
--@include call_state

-- Settles tag (seq field, count 1, token) of consumerName by its call
-- record: {"ok"}; or nil, having changed nothing, when the call does not
-- have field out to this consumer.
local function ackCallOne(field, token)
  local seq = tonumber(field)
  local c = seq and string.format('%d', seq) == field and callRead(token)
  if not c or c.holder ~= consumerName then
    return nil
  end
  local i = seq - c.first + 1
  if i < 1 or i > #c.bytes or string.sub(c.bytes, i, i) ~= '1' then
    return nil
  end
  local floor = ackFloor() -- before any write (includes/settle.lua)
  c.bytes = string.sub(c.bytes, 1, i - 1) .. '0' .. string.sub(c.bytes, i + 1)
  callStore(token, c, 1)
  rcall('HINCRBY', consumersKey, consumerName, '-1')
  settleMany({seq}, {field}, floor)
  rcall('HINCRBY', groupKey, 'acked', '1')
  return {'ok'}
end
