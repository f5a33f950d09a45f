--[[
  The parts of settling (includes/settle.lua) that only a queue with more
  than one group, or a seq reopened by replay, needs: records pinned by a
  replay, the trim point of all groups, a reopened seq settled again.
]]
--@include log
--@include log_side
--@include lowest_floor
--@include group_keys
--@include group_names
--@include bulk
--@include retain_mark
local function unpinned(seqs)
  if rcall('HLEN', pinnedKey) == 0 then
    return seqs
  end
  local out = {}
  for _, seq in ipairs(seqs) do
    if rcall('HEXISTS', pinnedKey, seq) == 0 then
      out[#out + 1] = seq
    end
  end
  return out
end

-- Records at or below the lowest ack floor of all groups are settled by all
-- of them. Only the group that held the lowest floor can raise it.
local function advanceTrim(oldFloor)
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0')
  if oldFloor > trimmed then
    return
  end
  local minFloor = lowestFloor(floorsKey)
  if minFloor ~= nil and minFloor > trimmed and string.byte(msgsKey, -1) == LOG_STREAM_BYTE then
    logTrim(msgsKey, minFloor)
    rcall('HSET', metaKey, 'trimmed', minFloor)
  elseif minFloor ~= nil and minFloor > trimmed then
    local gone = {}
    for s = trimmed + 1, minFloor do
      gone[#gone + 1] = s
    end
    gone = unpinned(gone)
    logDelete(msgsKey, gone)
    bulk('HDEL', settledKey, gone)
    rcall('HSET', metaKey, 'trimmed', minFloor)
  end
end

-- A reopened seq is settled again: unpin it; delete the record when no
-- group needs it any more.
local function settleReopened(seq, groups)
  if rcall('HINCRBY', pinnedKey, seq, -1) > 0 then
    return
  end
  rcall('HDEL', pinnedKey, seq)
  if string.byte(msgsKey, -1) == LOG_STREAM_BYTE then
    logForgetReplayed(seq, pinnedKey)
    return
  end
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0')
  -- In retention mode only a record below the trim point goes (the pin kept it).
  local counted = rcall('HEXISTS', metaKey, RETAIN) == 0
    and (groups <= 1 or tonumber(rcall('HGET', settledKey, seq) or '0') >= groups)
  if seq <= trimmed or counted then
    logDelete(msgsKey, {seq})
    rcall('HDEL', settledKey, seq)
  end
end
