--[[
  The lowest ack floor of the queue's groups: what a work queue's log is
  trimmed to.
]]

-- The lowest floor in the hash floors (group -> floor), a number, or nil
-- without groups; a floor that is not a number is passed over (settling
-- names it, includes/settle.lua).
local function lowestFloor(floors)
  local low = nil
  for _, f in ipairs(redis.call('HVALS', floors)) do
    f = tonumber(f)
    if f and (low == nil or f < low) then
      low = f
    end
  end
  return low
end
