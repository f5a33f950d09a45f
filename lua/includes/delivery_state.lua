--[[
  A group's delivery state of one message, persisted with the delivery itself
  (SPEC guarantee 5): "count:consumer:first_ms:last_ms". consumer is empty
  while the message waits for redelivery. It exists exactly while the message
  is delivered and not yet settled by the group.
]]
local function parseDelivery(seq, raw)
  if not raw then
    return nil
  end
  local count, holder, first, last = string.match(raw, '^(%d+):(.*):(%d+):(%d+)$')
  if not count then
    error('RQ_CORRUPT delivery state of seq ' .. seq .. ' does not parse: ' .. raw)
  end
  return {count = tonumber(count), holder = holder, first = first, last = last}
end

local function readDelivery(dlvKey, seq)
  return parseDelivery(seq, redis.call('HGET', dlvKey, seq))
end

local function formatDelivery(d)
  return d.count .. ':' .. d.holder .. ':' .. d.first .. ':' .. d.last
end

local function writeDelivery(dlvKey, seq, d)
  redis.call('HSET', dlvKey, seq, formatDelivery(d))
end
