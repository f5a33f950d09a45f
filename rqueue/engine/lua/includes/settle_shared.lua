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

-- Seqs a call deletes at most when the trim point moves: a long jump (the
-- lowest floor passing a long run acked above it) is deleted over the
-- settles and fetches that follow, SWEEP_STEP seqs each, so that no call
-- blocks Redis for it. Meta field "swept" says how far the deletion got
-- while it lags the trim point; every seq up to it is deleted.
local SWEEP_STEP = 2000
local SWEPT = 'swept'

-- Deletes what every group settled, from seq from + 1 up to the trim point
-- to, SWEEP_STEP seqs at most: records a replay pinned stay (in a stream
-- they are beside the log, includes/log.lua). lagging: whether meta field
-- "swept" is set.
local function sweepTo(from, to, lagging)
  local upTo = math.min(to, from + SWEEP_STEP)
  if string.byte(msgsKey, -1) == LOG_STREAM_BYTE then
    logTrim(msgsKey, upTo)
  else
    local gone = {}
    for s = from + 1, upTo do
      gone[#gone + 1] = s
    end
    gone = unpinned(gone)
    logDelete(msgsKey, gone)
    bulk('HDEL', settledKey, gone)
  end
  if upTo < to then
    rcall('HSET', metaKey, SWEPT, string.format('%d', upTo))
  elseif lagging then
    rcall('HDEL', metaKey, SWEPT)
  end
end

-- Where a lagging deletion stands: meta field "swept" (swept, as read) when
-- it is a seq below the trim point; else the trim point (one that does not
-- parse or stands above it is damage: what it claims is not trusted, and
-- the next move of the trim point deletes from there).
local function sweptFrom(swept, trimmed)
  local from = tonumber(swept or '')
  if from and from >= 0 and from % 1 == 0 and from < trimmed then
    return from
  end
  return trimmed
end

-- Goes on with a lagging deletion (swept: meta field "swept", set).
local function sweepOn(swept, trimmed)
  trimmed = trimmed or tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0
  local from = sweptFrom(swept, trimmed)
  if from < trimmed then
    sweepTo(from, trimmed, true)
  else
    rcall('HDEL', metaKey, SWEPT)
  end
end

-- Records at or below the lowest ack floor of all groups are settled by all
-- of them. Only the group that held the lowest floor can raise it; any
-- settle goes on with a deletion that lags it. swept: meta field "swept".
local function advanceTrim(oldFloor, swept)
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0
  local minFloor = oldFloor <= trimmed and lowestFloor(floorsKey)
  if minFloor and minFloor > trimmed then
    rcall('HSET', metaKey, 'trimmed', string.format('%d', minFloor))
    sweepTo(sweptFrom(swept, trimmed), minFloor, swept)
  elseif swept then
    sweepOn(swept, trimmed)
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
