--[[
  The one clock of the scripts. Production passes "" and the server's TIME is
  used, so every client agrees on lease deadlines whatever its own clock says;
  tests pass an explicit time to move time without sleeping.
]]
-- Returns now in ms, and as text for scripts that hand it to redis.call.
local function readNow(arg)
  if arg ~= nil and arg ~= '' then
    local now = tonumber(arg)
    return now, tostring(now)
  end
  local t = redis.call('TIME')
  -- The text from TIME's own strings (seconds, then the first three of six
  -- microsecond digits): formatting a number is a sprintf, dearer than this.
  local text = t[1] .. string.sub('00000' .. t[2], -6, -4)
  return text + 0, text -- the sum converts it: tonumber() would parse it twice
end
