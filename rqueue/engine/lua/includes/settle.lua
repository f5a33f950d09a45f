--[[
  The group is done with a list of seqs (acked, dead-lettered or dropped):
  advance the ack floor over every contiguous settled seq, keep the rest as
  runs of acked seqs above the floor (includes/acked_runs.lua), and delete
  each record once every group has settled it (work-queue retention), unless
  the queue is in retention mode (includes/retain_mark.lua). Work
  is one pass over the list plus a few calls per run of contiguous seqs in
  it: however many acked seqs the floor passes, it passes a run in one step.

  A seq reopened by replay (in the group's reopen set) was settled once
  already: settling it again puts it back under the floor or in the acked
  runs without counting it twice, and unpins its record. A pinned record is
  never deleted by another group's progress.
  fields, when given, are the same seqs as strings, in the same order.
  Settles for groupName.
]]
--@include log
--@include group_keys
--@include group_names
--@include bulk
--@include retain_mark
-- The multi-group and replay cases, and acks above the floor, made only
-- when a call meets one.
--@lazy sharedSettling settle_shared
--@lazy ackedRuns acked_runs

-- The group's ack floor, a number; RQ_CORRUPT (raised) when it is not a
-- seq. Callers that write before they settle (an ack takes its delivery
-- back first) read it first and hand it to settleMany, so that a damaged
-- floor stops the call before any write.
local function ackFloor()
  local raw = rcall('HGET', floorsKey, groupName)
  local floor = tonumber(raw or '0')
  if not (floor and floor >= 0 and floor % 1 == 0) then
    error('RQ_CORRUPT ' .. floorsKey .. ' field ' .. groupName .. ' (the ack floor) holds '
      .. string.sub(raw, 1, 40) .. ', not a seq')
  end
  return floor
end

-- The group's ack floor as the last settleMany of this call left it (nil:
-- none ran): fetch returns it without reading it again.
local settledFloor = nil

-- floorRead: the floor as ackFloor read it, or nil to read it here.
local function settleMany(seqs, fields, floorRead)
  if #seqs == 0 then
    return
  end
  local oldFloor = floorRead or ackFloor()
  for i = 2, #seqs do
    if seqs[i] < seqs[i - 1] then
      table.sort(seqs)
      fields = nil
      break
    end
  end
  local groups = rcall('HLEN', floorsKey)
  -- Both sets are empty while a group acks in order and nothing was
  -- replayed: one EXISTS then stands for the ZCARD and the lookups below.
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
  local floor = oldFloor
  -- The new floor as the caller's string when it is one of the seqs (an ack
  -- of the next seq): the two HSETs below then format no number.
  local floorText = nil
  local added = 0 -- acked seqs above the floor, net of those the floor passed
  local count = #seqs
  local i = 1
  while i <= count do
    -- seqs[i..j] is one run of contiguous seqs (a repeated seq stays in it).
    local j = i
    while j < count and seqs[j + 1] - seqs[j] <= 1 do
      j = j + 1
    end
    local first, last = seqs[i], seqs[j]
    if last <= floor then
      -- Under the floor already (a reopened seq settled again): nothing to keep.
    elseif first <= floor + 1 then
      floor = last
      floorText = fields and fields[j]
      if setsExist then
        -- Runs are kept apart by at least one unsettled seq, so at most one
        -- starts right above the new floor, and none after it touches it.
        --@make ackedRuns
        local runLast = takeRunAt(string.format('%d', floor + 1))
        if runLast then
          added = added - (runLast - floor)
          floor = runLast
          floorText = nil
        end
      end
    else
      --@make ackedRuns
      -- Runs of this call lie apart too: only those there before can touch it.
      addAckedRun(first, last, fields and fields[i], fields and fields[j], setsExist)
      added = added + (last - first + 1)
    end
    i = j + 1
  end
  if added ~= 0 then
    rcall('HINCRBY', groupKey, ACKED_ABOVE, string.format('%d', added))
  end
  -- In retention mode the trim step deletes records (includes/retain_mark.lua).
  -- Read with it: "prio", set once the queue had a priority or keyed message,
  -- and "swept", set while deleting what the trim point passed lags it
  -- (includes/settle_shared.lua).
  local metaFlags = rcall('HMGET', metaKey, RETAIN, 'prio', 'swept')
  local retained, swept = metaFlags[1] ~= false, metaFlags[3]
  settledFloor = floor
  if floor ~= oldFloor then
    floorText = floorText or floor
    rcall('HSET', floorsKey, groupName, floorText)
    if metaFlags[2] then
      -- Priority and keyed messages are handed out apart from the cursor, so
      -- settling one may take the floor past it: the cursor goes up with the
      -- floor (every seq up to it is settled), for the scan of new messages
      -- would meet those seqs again after the log dropped them, and purge
      -- and the doctor hold the cursor at or above the floor.
      local cursor = tonumber(rcall('HGET', groupKey, 'cursor') or '0')
      if cursor and cursor < floor then
        rcall('HSET', groupKey, 'cursor', floorText, 'cursor_checked', floorText)
      end
    end
    if groups <= 1 and not retained then
      rcall('HSET', metaKey, 'trimmed', floorText)
    end
  end
  if groups <= 1 and not swept then
    -- One group and no deletion lagging: the common case, which makes none
    -- of the shared helpers.
    if retained then
      return
      --@layout hash
    else
      --@end
      --@layout stream
    elseif string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE then
      --@end
      -- The strings when nothing was reopened: a number handed to redis.call
      -- is formatted again with sprintf, which costs more than the HDEL.
      logDelete(msgsKey, (fresh == seqs and fields) or fresh)
      return
      --@layout stream
    elseif floor - oldFloor <= 5000 then -- a stream's step of sweep (includes/settle_shared.lua)
      -- A stream log's entries go with the floor, none one by one
      -- (includes/log.lua).
      if floor ~= oldFloor then
        logTrim(msgsKey, floor)
      end
      return
      --@end
    end
  elseif retained and not swept then
    return
  end
  --@make sharedSettling
  settleShared(fresh, floor, oldFloor, groups, swept, retained)
end
