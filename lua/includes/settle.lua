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
  fields, when given, are the same seqs as strings, in the same order.
  Settles for groupName; needs group_keys, group_names and bulk.
]]
-- The multi-group and replay cases, made only when a call meets one.
--@lazy sharedSettling settle_shared

local function settleMany(seqs, fields)
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
  local groups = rcall('HLEN', floorsKey)
  -- Both sets are empty while a group acks in order and nothing was
  -- replayed: one EXISTS then stands for the ZCARD and the SREM below.
  local setsExist = rcall('EXISTS', reopenKey, ackedKey) > 0
  local fresh = seqs
  if setsExist and rcall('ZCARD', reopenKey) > 0 then
    --@make sharedSettling
    fresh = {}
    for _, seq in ipairs(seqs) do
      if rcall('ZREM', reopenKey, seq) == 1 then
        settleReopened(seq, groups)
      else
        fresh[#fresh + 1] = seq
      end
    end
  end
  local oldFloor = (rcall('HGET', floorsKey, groupName) or 0) + 0
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
      -- The caller's string when there is one: redis.call formats a number
      -- with %.17g, which costs more than the SADD's own work for it.
      above[#above + 1] = fields and fields[i] or seq
    end
  end
  bulk('SADD', ackedKey, above)
  while (setsExist or #above > 0) and rcall('SREM', ackedKey, string.format('%d', floor + 1)) == 1 do
    floor = floor + 1
    floorText = nil
  end
  if floor ~= oldFloor then
    floorText = floorText or floor
    rcall('HSET', floorsKey, groupName, floorText)
    if groups <= 1 then
      rcall('HSET', metaKey, 'trimmed', floorText)
    end
  end
  if groups <= 1 then
    -- The strings when nothing was reopened: a number handed to redis.call
    -- is formatted again with sprintf, which costs more than the HDEL.
    bulk('HDEL', msgsKey, (fresh == seqs and fields) or fresh)
    return
  end
  --@make sharedSettling
  local done = {}
  for _, seq in ipairs(fresh) do
    if rcall('HINCRBY', settledKey, seq, 1) >= groups then
      done[#done + 1] = seq
    end
  end
  done = unpinned(done)
  bulk('HDEL', msgsKey, done)
  bulk('HDEL', settledKey, done)
  if floor ~= oldFloor then
    advanceTrim(oldFloor)
  end
end
