--[[
  Takes back everything a group has in flight or waiting (a reset or a
  delete of the group): leases, delivery states, redeliveries, delays, the
  consumers' counts, the seqs a replay reopened (unpinning their records),
  the acked runs, the priority set and the ordering keys' sets with their
  pull position. A tag of a delivery taken back names no delivery any
  more: its settle is refused (RQ_UNKNOWN_TAG, or RQ_ACKED at or below the
  new floor), and a delivery made again later carries another token
  (guarantee 11). Returns how many deliveries were in flight.
  Work: the group's in-flight and waiting sets, read whole.
]]
--@include log_one
--@include log_side
--@include group_keys
--@include group_names
--@include delivery_state
--@include retain_mark
local function clearGroup()
  --@layout stream
  if callsKey then
    --@make callPaths
    splitHeldBy(nil) -- call deliveries, per message, taken back below (includes/call_state.lua)
    rcall('DEL', callsKey, callExpKey, callSeqKey)
    rcall('HDEL', groupKey, 'callout')
  end
  --@end
  local cancelled = 0
  for _, s in ipairs(rcall('ZRANGE', leaseKey, 0, -1)) do
    if s ~= SKIPLIST_PIN then
      rcall('ZREM', leaseKey, s)
      cancelled = cancelled + 1
    end
  end
  for _, f in ipairs(rcall('HKEYS', dlvKey)) do
    if f ~= DLV_PIN_FIELD then
      rcall('HDEL', dlvKey, f)
    end
  end
  rcall('DEL', readyKey, delayKey, ackedKey)
  local consumers = rcall('HKEYS', consumersKey)
  for _, c in ipairs(consumers) do
    rcall('HSET', consumersKey, c, 0)
  end
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0
  for _, s in ipairs(rcall('ZRANGE', reopenKey, 0, -1)) do
    if rcall('HINCRBY', pinnedKey, s, -1) <= 0 then
      rcall('HDEL', pinnedKey, s)
      if logIsStream(msgsKey) then
        logForgetReplayed(s, pinnedKey)
      elseif tonumber(s) <= trimmed then
        logDeleteOne(msgsKey, sideKey, s, pinnedKey)
      end
    end
  end
  rcall('DEL', reopenKey)
  -- The priority set holds what the group read from the priority log and
  -- has not handed out; without it and its pull position ("pcur"), the
  -- next fetch pulls again from the group's new floor (fetch.lua).
  rcall('DEL', prioSetKey)
  -- The same for ordering keys: what the group pulled and has not handed
  -- out, and the deliveries each key holds (all taken back above).
  if keyQueueKey then
    rcall('DEL', keyQueueKey, keyReadyKey, keyBusyKey, keyFlightKey)
  end
  rcall('HDEL', groupKey, 'pcur')
  rcall('HSET', groupKey, ACKED_ABOVE, 0)
  -- The settled hash counts which groups settled a seq; once a group moves
  -- or goes, the counts are no longer true, so the trim step deletes
  -- records from here on (includes/retain_mark.lua). The counts go too:
  -- retention mode reads none, and counts that start again from nothing
  -- can only keep a record longer, never delete one a group needs (should
  -- the mode's field be lost).
  rcall('HSETNX', metaKey, RETAIN, '- -')
  rcall('DEL', settledKey)
  return cancelled
end
