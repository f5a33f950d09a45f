--[[
  A stream log's side records that no group needs any more (includes/
  log.lua): those of the seqs at or below the trim point (meta field
  "trimmed"), found by the priority log, which lists every seq with a side
  record. fetch deletes them as it reads the priority log (its own copy, on
  its hot path); group_delete.lua and the retention step (retain.lua) call
  this, so that a queue whose last group is deleted, and whose fetches
  stop, lets them go too. A seq reopened by replay keeps its record beside
  the pins.
]]
--@include bulk

local SIDE_SWEEP_BATCH = '1000' -- priority log entries per call, as fetch's PULL_BATCH

-- Deletes up to SIDE_SWEEP_BATCH side records (sideKey) at or below the
-- trim point of the queue metaKey, with their priority log (prioKey)
-- entries; how many went.
local function sweepSide(metaKey, prioKey, sideKey)
  local trimmedTo = redis.call('HGET', metaKey, 'trimmed')
  if not trimmedTo then
    return 0
  end
  local passedLog = redis.call('ZRANGEBYSCORE', prioKey, '-inf', trimmedTo, 'WITHSCORES', 'LIMIT', '0',
    SIDE_SWEEP_BATCH)
  if #passedLog == 0 then
    return 0
  end
  local fields = {}
  for i = 2, #passedLog, 2 do
    fields[#fields + 1] = passedLog[i]
  end
  bulk('HDEL', sideKey, fields)
  redis.call('ZREMRANGEBYSCORE', prioKey, '-inf', passedLog[#passedLog])
  return #fields
end
