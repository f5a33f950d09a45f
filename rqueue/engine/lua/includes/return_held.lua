--[[
  Takes back every delivery a member holds. A graceful leave puts them back at
  once with their counts kept; a dead member's deliveries count as failed
  attempts, so a message that kills its workers reaches max_deliveries and is
  dead-lettered. Work is bounded by the group's in-flight set (max_inflight).
  Returns returned, deadLettered.
]]
--@include group_keys
--@include group_names
--@include delivery_state
--@include release
--@include requeue
--@include retry_or_dead_letter
--@include dead_letter_corrupt_state
--@include record_event
local function returnHeld(member, graceful)
  local returned, dead = 0, 0
  -- What the member counts as held, against what the lease set shows it
  -- holding: a delivery whose lease was deleted is found by neither, so it
  -- is recorded as a "corrupt" event naming the keys (rqueue doctor
  -- --repair makes it ready again).
  --@layout stream
  if callsKey then
    --@make callPaths
    splitHeldBy(member) -- its call deliveries, per message (includes/call_state.lua)
  end
  --@end
  local counted, leased = rcall('HGET', consumersKey, member), 0
  for _, s in ipairs(rcall('ZRANGE', leaseKey, 0, -1)) do
    if s == SKIPLIST_PIN then
      break -- last: its score is +inf
    end
    local seq = tonumber(s)
    local raw = rcall('HGET', dlvKey, seq)
    local d, corrupt = parseDelivery(seq, raw)
    if corrupt then
      deadLetterCorruptState(seq, raw)
      leased = leased + 1 -- whose it was is lost with its state: counted as possibly this member's
    elseif d ~= nil and d.holder == member then
      leased = leased + 1
      if graceful then
        release(seq, d)
        writeDelivery(dlvKey, seq, d)
        requeue(seq, 0)
        returned = returned + 1
      elseif retryOrDeadLetter(seq, d, nil, 'consumer ' .. member .. ' stopped heartbeating') == 'dead' then
        dead = dead + 1
      else
        returned = returned + 1
      end
    end
  end
  if counted and not ((tonumber(counted) or 1 / 0) <= leased) then
    recordEvent('corrupt', '', consumersKey .. ' field ' .. member .. ' counted ' .. counted .. ' deliveries, but '
      .. leaseKey .. ' leased it ' .. leased .. ': run rqueue doctor --repair')
  end
  rcall('HDEL', consumersKey, member)
  rcall('ZREM', beatsKey, member)
  rcall('HDEL', groupKey, 'live:' .. member)
  return returned, dead
end
