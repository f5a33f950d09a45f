--[[
  Variadic commands over long lists, in chunks: unpack() of more than a few
  thousand values overflows Lua's C stack.
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

-- HMGET over a list of fields; returns one value (or false) per field.
local function bulkGet(key, fields)
  if #fields == 0 then
    return {}
  elseif #fields <= BULK_CHUNK then
    return redis.call('HMGET', key, unpack(fields)) -- one chunk: the reply as it is
  end
  local out = {}
  for i = 1, #fields, BULK_CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + BULK_CHUNK - 1, #fields)))
    for _, v in ipairs(part) do
      out[#out + 1] = v
    end
  end
  return out
end
