--[[
  The group is done with a list of seqs (acked, dead-lettered or dropped):
  advance the ack floor over every contiguous settled seq, keep the rest in
  the acked set, and delete each record once every group has settled it
  (work-queue retention). Work is one pass over the list plus one step per
  acked seq the floor passes.

  A seq reopened by replay (in the group's reopen set) was settled once
  already: settling it again puts it back under the floor or in the acked
  set without counting it twice, and unpins its record. A pinned record is
  never deleted by another group's progress.
  qk holds the queue keys: meta, msgs, floors, settled, acked, pinned, reopen.
  fields, when given, are the same seqs as strings, in the same order.
]]
local function unpinned(qk, seqs)
  if redis.call('HLEN', qk.pinned) == 0 then
    return seqs
  end
  local out = {}
  for _, seq in ipairs(seqs) do
    if redis.call('HEXISTS', qk.pinned, seq) == 0 then
      out[#out + 1] = seq
    end
  end
  return out
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
    local gone = {}
    for s = trimmed + 1, minFloor do
      gone[#gone + 1] = s
    end
    gone = unpinned(qk, gone)
    bulk('HDEL', qk.msgs, gone)
    bulk('HDEL', qk.settled, gone)
    redis.call('HSET', qk.meta, 'trimmed', minFloor)
  end
end

-- A reopened seq is settled again: unpin it; delete the record when no
-- group needs it any more.
local function settleReopened(qk, seq, groups)
  if redis.call('HINCRBY', qk.pinned, seq, -1) > 0 then
    return
  end
  redis.call('HDEL', qk.pinned, seq)
  local trimmed = tonumber(redis.call('HGET', qk.meta, 'trimmed') or '0')
  if groups <= 1 or seq <= trimmed or tonumber(redis.call('HGET', qk.settled, seq) or '0') >= groups then
    redis.call('HDEL', qk.msgs, seq)
    redis.call('HDEL', qk.settled, seq)
  end
end

local function settleMany(qk, groupName, seqs, fields)
  if #seqs == 0 then
    return
  end
  for i = 2, #seqs do
    if seqs[i] < seqs[i - 1] then
      table.sort(seqs)
      fields = nil
      break
    end
  end
  local groups = redis.call('HLEN', qk.floors)
  local fresh = seqs
  if redis.call('ZCARD', qk.reopen) > 0 then
    fresh = {}
    for _, seq in ipairs(seqs) do
      if redis.call('ZREM', qk.reopen, seq) == 1 then
        settleReopened(qk, seq, groups)
      else
        fresh[#fresh + 1] = seq
      end
    end
  end
  local oldFloor = tonumber(redis.call('HGET', qk.floors, groupName) or '0')
  local floor = oldFloor
  -- The new floor as the caller's string when it is one of the seqs (an ack
  -- of the next seq): the two HSETs below then format no number.
  local floorText = nil
  local above = {}
  for i, seq in ipairs(seqs) do
    if seq == floor + 1 then
      floor = seq
      floorText = fields and fields[i]
    elseif seq > floor then
      above[#above + 1] = seq
    end
  end
  bulk('SADD', qk.acked, above)
  while redis.call('SREM', qk.acked, floor + 1) == 1 do
    floor = floor + 1
    floorText = nil
  end
  if floor ~= oldFloor then
    floorText = floorText or floor
    redis.call('HSET', qk.floors, groupName, floorText)
    if groups <= 1 then
      redis.call('HSET', qk.meta, 'trimmed', floorText)
    end
  end
  if groups <= 1 then
    -- The strings when nothing was reopened: a number handed to redis.call
    -- is formatted again with sprintf, which costs more than the HDEL.
    bulk('HDEL', qk.msgs, (fresh == seqs and fields) or fresh)
    return
  end
  local done = {}
  for _, seq in ipairs(fresh) do
    if redis.call('HINCRBY', qk.settled, seq, 1) >= groups then
      done[#done + 1] = seq
    end
  end
  done = unpinned(qk, done)
  bulk('HDEL', qk.msgs, done)
  bulk('HDEL', qk.settled, done)
  if floor ~= oldFloor then
    advanceTrim(qk, oldFloor)
  end
end
