--[[
  The group is done with a list of seqs (acked, dead-lettered or dropped),
  none of them settled before: advance the ack floor over every contiguous
  settled seq, keep the rest in the acked set, and delete each record once
  every group has settled it (work-queue retention). Work is one pass over
  the list plus one step per acked seq the floor passes.
  qk holds the queue keys: meta, msgs, floors, settled, acked.
]]
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
    local gone = {}
    for s = trimmed + 1, minFloor do
      gone[#gone + 1] = s
    end
    bulk('HDEL', qk.msgs, gone)
    bulk('HDEL', qk.settled, gone)
    redis.call('HSET', qk.meta, 'trimmed', minFloor)
  end
end

local function settleMany(qk, groupName, seqs)
  if #seqs == 0 then
    return
  end
  table.sort(seqs)
  local oldFloor = tonumber(redis.call('HGET', qk.floors, groupName) or '0')
  local floor = oldFloor
  local above = {}
  for _, seq in ipairs(seqs) do
    if seq == floor + 1 then
      floor = seq
    elseif seq > floor then
      above[#above + 1] = seq
    end
  end
  bulk('SADD', qk.acked, above)
  while redis.call('SREM', qk.acked, floor + 1) == 1 do
    floor = floor + 1
  end
  local groups = redis.call('HLEN', qk.floors)
  if floor ~= oldFloor then
    redis.call('HSET', qk.floors, groupName, floor)
    if groups <= 1 then
      redis.call('HSET', qk.meta, 'trimmed', floor)
    end
  end
  if groups <= 1 then
    bulk('HDEL', qk.msgs, seqs)
    return
  end
  for _, seq in ipairs(seqs) do
    if redis.call('HINCRBY', qk.settled, seq, 1) >= groups then
      redis.call('HDEL', qk.msgs, seq)
      redis.call('HDEL', qk.settled, seq)
    end
  end
  if floor ~= oldFloor then
    advanceTrim(qk, oldFloor)
  end
end
