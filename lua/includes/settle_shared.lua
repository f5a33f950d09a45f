--[[
  The parts of settling (includes/settle.lua) that only a queue with more
  than one group, or a seq reopened by replay, needs: records pinned by a
  replay, the trim point of all groups, a reopened seq settled again.
  qk holds the queue keys (as in settle.lua). Needs bulk.
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
