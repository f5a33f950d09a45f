--[[
  The one clock of the scripts. Production passes "" and the server's TIME is
  used, so every client agrees on lease deadlines whatever its own clock says;
  tests pass an explicit time to move time without sleeping.
]]
local function readNow(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
