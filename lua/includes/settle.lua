--[[
  The group is done with seq (acked, dead-lettered or dropped): advance the ack
  floor over every contiguous settled seq, keep the rest in the acked set, and
  delete the record once every group has settled it (work-queue retention).
  qk holds the queue keys: meta, msgs, floors, settled, acked.
  Returns false when seq was already settled.
]]
local function deleteRecord(qk, seq)
  redis.call('HDEL', qk.msgs, seq)
  redis.call('HDEL', qk.settled, seq)
end

-- Records at or below the lowest ack floor of all groups are settled by all
-- of them. Only the group that held the lowest floor can raise it.
local function advanceTrim(qk, oldFloor)
  local trimmed = tonumber(redis.call('HGET', qk.meta, 'trimmed') or '0')
  if oldFloor > trimmed then
    return
  end
  local minFloor = nil
  for _, f in ipairs(redis.call('HVALS', qk.floors)) do
    f = tonumber(f)
    if minFloor == nil or f < minFloor then
      minFloor = f
    end
  end
  if minFloor ~= nil and minFloor > trimmed then
    for s = trimmed + 1, minFloor do
      deleteRecord(qk, s)
    end
    redis.call('HSET', qk.meta, 'trimmed', minFloor)
  end
end

local function settle(qk, groupName, seq)
  local floor = tonumber(redis.call('HGET', qk.floors, groupName) or '0')
  if seq <= floor then
    return false
  end
  local groups = redis.call('HLEN', qk.floors)
  if seq ~= floor + 1 then
    if redis.call('SADD', qk.acked, seq) == 0 then
      return false
    end
  else
    local oldFloor = floor
    floor = seq
    while redis.call('SREM', qk.acked, floor + 1) == 1 do
      floor = floor + 1
    end
    redis.call('HSET', qk.floors, groupName, floor)
    if groups <= 1 then
      redis.call('HSET', qk.meta, 'trimmed', floor)
    else
      advanceTrim(qk, oldFloor)
    end
  end
  if groups <= 1 then
    redis.call('HDEL', qk.msgs, seq)
  elseif redis.call('HINCRBY', qk.settled, seq, 1) >= groups then
    deleteRecord(qk, seq)
  end
  return true
end
