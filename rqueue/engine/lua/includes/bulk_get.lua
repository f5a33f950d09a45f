--[[
  HMGET over a long list of fields, in chunks of BULK_CHUNK (includes/bulk.lua);
  returns one value (or false) per field.
]]
--@include bulk
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
