--[[
  The parts of settling (includes/settle.lua) that only a queue with more
  than one group, a seq reopened by replay, or a long jump of the trim
  point needs: records pinned by a replay, the trim point of all groups, a
  reopened seq settled again, the deletion of a jump in steps.
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

-- Deletes what every group settled up to the trim point to, from from + 1
-- or from meta field "swept" (swept, as read; false when unset) when that
-- is a seq below from. Records a replay pinned stay (in a stream they are
-- beside the log, includes/log.lua). A "swept" that is damage (no seq, or
-- not below from) is dropped unheeded.
local function sweep(swept, from, to)
  -- Seqs a call deletes at most: a long jump of the trim point (the lowest
  -- floor passing a long run acked above it) is deleted over the settles
  -- and fetches that follow, so that no call blocks Redis for it. Meta
  -- field "swept" says how far the deletion got while it lags the trim
  -- point; every seq up to it is deleted. A stream's exact trim costs
  -- about 0.1 µs an entry, a hash log's deletes about 1.2 µs a seq: either
  -- step takes Redis well under a millisecond. (Set here, not above: a
  -- top-level local that settleMany names costs every call that makes it.)
  local stream = string.byte(msgsKey, -1) == LOG_STREAM_BYTE
  local SWEEP_STEP = stream and 5000 or 500
  local at = tonumber(swept or '')
  if at and at >= 0 and at % 1 == 0 and at < from then
    from = at
  end
  local upTo = math.min(to, from + SWEEP_STEP)
  if upTo <= from then
    -- nothing to delete
  elseif stream then
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
    rcall('HSET', metaKey, 'swept', string.format('%d', upTo))
  elseif swept then
    rcall('HDEL', metaKey, 'swept')
  end
end

-- The rest of settleMany (includes/settle.lua) once the floor is written:
-- several groups, a deletion lagging the trim point (swept: meta field
-- "swept" as read), or a stream's floor that jumped far. fresh are the
-- seqs settled that were not reopened.
local function settleShared(fresh, floor, oldFloor, groups, swept, retained)
  local stream = string.byte(msgsKey, -1) == LOG_STREAM_BYTE
  if retained or stream then
    -- Retention mode's trim step deletes records (includes/retain_mark.lua),
    -- and a stream log's entries go with the lowest floor, none one by one
    -- (includes/log.lua).
  elseif groups > 1 then
    local done = {}
    for _, seq in ipairs(fresh) do
      if rcall('HINCRBY', settledKey, seq, 1) >= groups then
        done[#done + 1] = seq
      end
    end
    done = unpinned(done)
    logDelete(msgsKey, done)
    bulk('HDEL', settledKey, done)
  else
    logDelete(msgsKey, fresh)
  end
  if stream and groups <= 1 and not retained then
    sweep(swept, oldFloor, floor) -- the trim point is the group's floor
    return
  end
  -- Records at or below the lowest ack floor of all groups are settled by
  -- all of them. Only the group that held the lowest floor can raise it.
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0
  local to = trimmed
  if groups > 1 and not retained and floor ~= oldFloor and oldFloor <= trimmed then
    local low = lowestFloor(floorsKey)
    if low and low > trimmed then
      rcall('HSET', metaKey, 'trimmed', string.format('%d', low))
      to = low
    end
  end
  if to > trimmed or swept then
    sweep(swept, trimmed, to)
  end
end

-- A reopened seq is settled again: unpin it; delete the record when no
-- group needs it any more.
local function settleReopened(seq, groups)
  if rcall('HINCRBY', pinnedKey, seq, -1) > 0 then
    return
  end
  if string.byte(msgsKey, -1) == LOG_STREAM_BYTE then
    rcall('HDEL', pinnedKey, seq)
    logForgetReplayed(seq, pinnedKey)
    return
  end
  -- With the stream layout's copy of the record ("r<seq>"): an ack of a
  -- hash-layout client, which no layout check stops (includes/layout.lua),
  -- may meet a queue migrate.lua moved to the stream.
  rcall('HDEL', pinnedKey, seq, 'r' .. seq)
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0')
  -- In retention mode only a record below the trim point goes (the pin kept it).
  local counted = rcall('HEXISTS', metaKey, RETAIN) == 0
    and (groups <= 1 or tonumber(rcall('HGET', settledKey, seq) or '0') >= groups)
  if seq <= trimmed or counted then
    logDelete(msgsKey, {seq})
    rcall('HDEL', settledKey, seq)
  end
end
