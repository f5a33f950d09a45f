--[[
  A variadic command (cmd key v1 v2 ...) over a long list of values, sent
  in chunks: unpack() of more than a few thousand values overflows Lua's C
  stack.
]]
local BULK_CHUNK = 1000 -- values per call; even, so pairs never split

local function bulk(cmd, key, values)
  local count = #values
  for i = 1, count, BULK_CHUNK do
    local last = i + BULK_CHUNK - 1 -- not math.min(): a C function call costs more
    if last > count then
      last = count
    end
    redis.call(cmd, key, unpack(values, i, last))
  end
end
