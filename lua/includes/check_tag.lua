--[[
  Classifies a delivery tag (seq, count) presented by consumerName.
  Returns a code and the delivery state:
    "ok"              the tag may settle the message
    "RQ_ACKED"        the group already settled seq
    "RQ_UNKNOWN_TAG"  no such delivery was made
    "RQ_NOT_HELD"     another consumer holds this very delivery
    "RQ_STALE"        (only when lateOk is false) the delivery is no longer
                      held: its lease ran out or a newer delivery exists
]]
local function checkTag(seq, count, lateOk)
  if seq == nil or count == nil or count < 1 then
    return 'RQ_UNKNOWN_TAG', nil
  end
  local floor = tonumber(rcall('HGET', floorsKey, groupName) or '0')
  if seq <= floor or rcall('SISMEMBER', ackedKey, seq) == 1 then
    return 'RQ_ACKED', nil
  end
  local d = readDelivery(dlvKey, seq)
  if d == nil or count > d.count then
    return 'RQ_UNKNOWN_TAG', d
  end
  if count == d.count and d.holder == consumerName then
    return 'ok', d
  end
  if count == d.count and d.holder ~= '' then
    return 'RQ_NOT_HELD', d
  end
  if lateOk then
    return 'ok', d
  end
  return 'RQ_STALE', d
end
