--[[
  A group's delivery state of one message, persisted with the delivery itself
  (SPEC guarantee 5): "count:consumer:first_ms:last_ms". consumer is empty
  while the message waits for redelivery.
]]
local function readDelivery(dlvKey, seq)
  local raw = redis.call('HGET', dlvKey, seq)
  if not raw then
    return nil
  end
  local count, holder, first, last = string.match(raw, '^(%d+):(.*):(%d+):(%d+)$')
  if not count then
    error('RQ_CORRUPT delivery state of seq ' .. seq .. ' does not parse: ' .. raw)
  end
  return {count = tonumber(count), holder = holder, first = first, last = last}
end

local function writeDelivery(dlvKey, seq, d)
  redis.call('HSET', dlvKey, seq, d.count .. ':' .. d.holder .. ':' .. d.first .. ':' .. d.last)
end
