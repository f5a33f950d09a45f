--[[
  The group is done with a message (dead-lettered or dropped): its delivery
  state is forgotten, it leaves whichever set holds it, and it is settled.
]]
--@include group_keys
--@include group_names
--@include release
--@include settle
local function complete(seq, d)
  local floor = ackFloor() -- before any write (includes/settle.lua)
  if d.holder == '' then
    rcall('ZREM', readyKey, seq)
    rcall('ZREM', delayKey, seq)
  end
  release(seq, d)
  rcall('HDEL', dlvKey, seq)
  settleMany({seq}, nil, floor)
end
