--[[
  A seq stored in a hash field, read where damage must stop a call before
  its first write (a cursor, a last seq, a copy's cursor).
]]

-- Field field of hash key as a number, 0 when missing; RQ_CORRUPT (raised)
-- naming the key and the value when it is not a whole number >= 0.
local function seqAt(key, field)
  local raw = redis.call('HGET', key, field)
  local v = tonumber(raw or '0')
  if not (v and v >= 0 and v % 1 == 0) then
    error('RQ_CORRUPT ' .. key .. ' field ' .. field .. ' holds ' .. string.sub(raw, 1, 40) .. ', not a seq')
  end
  return v
end
