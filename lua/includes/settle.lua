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
-- The multi-group and replay cases, made only when a call meets one.
--@lazy sharedSettling settle_shared

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
  -- Both sets are empty while a group acks in order and nothing was
  -- replayed: one EXISTS then stands for the ZCARD and the SREM below.
  local setsExist = redis.call('EXISTS', qk.reopen, qk.acked) > 0
  local fresh = seqs
  if setsExist and redis.call('ZCARD', qk.reopen) > 0 then
    --@make sharedSettling
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
  while (setsExist or #above > 0) and redis.call('SREM', qk.acked, floor + 1) == 1 do
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
  --@make sharedSettling
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
