--[[
  Reads one group's figures in one consistent snapshot. Changes nothing.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
    ARGV[1..7] the group arguments (includes/group_args.lua); only ARGV[1],
      the group name, and ARGV[3], now, are read
  Output:
    flat list of name, value pairs: last_seq, floor (lowered below any seq
    reopened by replay), stored_floor, reopened_below_floor, cursor, acked_above_floor,
    paused ("1" or ""), in_flight, expired_leases, oldest_lease_ms, ready, delayed,
    keys_ready, keys_busy (ordering keys), counters
    (acked, nacked, redelivered, expired, dead_lettered, dropped), then
    "consumer", name, held, liveness deadline (ms), liveness timeout (ms)
    for each consumer; the last sign of life is deadline - timeout
  Errors:
    RQ_CORRUPT  the last seq, the cursor or the floor is garbage, or the
                last seq is below the cursor or missing while records are
                stored (a deleted meta hash)
]]
--@include log
--@include read_now
--@include group_keys
--@include group_names
--@include layout
--@include stored_seq

local wrongLayout = checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end
local now = readNow(ARGV[3])

local out = {}
local function put(name, value)
  out[#out + 1] = name
  out[#out + 1] = value
end

put('now', now)
-- Figures from damaged keys would mislead (a pending count below zero):
-- a seq that is garbage, or a last seq below the cursor or missing while
-- records are stored, is RQ_CORRUPT naming the key.
local lastSeq, cursor = seqAt(metaKey, 'seq'), seqAt(groupKey, 'cursor')
if lastSeq < cursor or lastSeq == 0 and logAny(msgsKey) then
  error('RQ_CORRUPT ' .. metaKey .. ' field seq (the last seq) is ' .. (rcall('HGET', metaKey, 'seq') or 'missing')
    .. ', below the cursor ' .. cursor .. ' of ' .. groupKey .. ' or the records stored')
end
put('last_seq', rcall('HGET', metaKey, 'seq') or '0')
-- A seq reopened by replay at or below the stored floor is unsettled again:
-- the floor reported is below it, and it counts as pending.
local storedFloor = seqAt(floorsKey, groupName)
local floor = storedFloor
local lowest = rcall('ZRANGE', reopenKey, 0, 0)
if lowest[1] ~= nil and tonumber(lowest[1]) <= storedFloor then
  floor = tonumber(lowest[1]) - 1
end
put('floor', floor)
put('stored_floor', storedFloor)
put('reopened_below_floor', rcall('ZCOUNT', reopenKey, '-inf', storedFloor))
put('cursor', rcall('HGET', groupKey, 'cursor') or '0')
put('paused', rcall('HGET', groupKey, 'paused') or '')
put('acked_above_floor', rcall('HGET', groupKey, ACKED_ABOVE) or '0')
put('in_flight', deliveriesOut())
--@layout hash
put('expired_leases', rcall('ZCOUNT', leaseKey, '-inf', now))
local oldest = rcall('ZRANGE', leaseKey, 0, 0)
if oldest[1] ~= nil and oldest[1] ~= SKIPLIST_PIN then
  local raw = rcall('HGET', dlvKey, oldest[1])
  -- The time of the delivery from its state's first line (includes/delivery_state.lua):
  -- count:consumer:first:last:token, or count:consumer:first:last before tokens.
  local head = raw and string.match(raw, '^[^\n]*')
  local last = head and (string.match(head, '^%d+:.*:%d+:(%d+):%w*$') or string.match(head, '^%d+:.*:%d+:(%d+)$'))
  put('oldest_lease_ms', last and (now - tonumber(last)) or '')
else
  put('oldest_lease_ms', '')
end
--@end
--@layout stream
local expiredLeases = rcall('ZCOUNT', leaseKey, '-inf', now)
local oldestAge = nil
local oldest = rcall('ZRANGE', leaseKey, 0, 0)
if oldest[1] ~= nil and oldest[1] ~= SKIPLIST_PIN then
  local raw = rcall('HGET', dlvKey, oldest[1])
  -- The time of the delivery from its state's first line (includes/delivery_state.lua):
  -- count:consumer:first:last:token, or count:consumer:first:last before tokens.
  local head = raw and string.match(raw, '^[^\n]*')
  local last = head and (string.match(head, '^%d+:.*:%d+:(%d+):%w*$') or string.match(head, '^%d+:.*:%d+:(%d+)$'))
  oldestAge = last and (now - tonumber(last))
end
if callsKey then
  -- A stream log's calls (includes/call_state.lua, "<first> <ms> <out> ..."):
  -- the seqs out on calls past their deadline count as expired leases, and
  -- the call with the earliest deadline has a lease's age.
  local due = rcall('ZRANGEBYSCORE', callExpKey, '-inf', now)
  for _, token in ipairs(due) do
    expiredLeases = expiredLeases + (tonumber(string.match(rcall('HGET', callsKey, token) or '', '^%d+ %d+ (%d+) ') or '0'))
  end
  local first = rcall('ZRANGE', callExpKey, 0, 0)
  local ms = first[1] and string.match(rcall('HGET', callsKey, first[1]) or '', '^%d+ (%d+) ')
  if ms and (oldestAge == nil or now - tonumber(ms) > oldestAge) then
    oldestAge = now - tonumber(ms)
  end
end
put('expired_leases', expiredLeases)
put('oldest_lease_ms', oldestAge or '')
--@end
put('ready', rcall('ZCARD', readyKey))
put('delayed', rcall('ZCARD', delayKey))
-- Ordering keys: ready to hand out, and with deliveries out (a key may be in
-- both below its key_concurrency). Absent keys for a layout of 20 keys.
if keyReadyKey then
  put('keys_ready', rcall('ZCARD', keyReadyKey))
  put('keys_busy', rcall('ZCARD', keyBusyKey))
end
for _, name in ipairs({'acked', 'nacked', 'redelivered', 'expired', 'dead_lettered', 'dropped'}) do
  put(name, rcall('HGET', groupKey, name) or '0')
end
local held = rcall('HGETALL', consumersKey)
for i = 1, #held, 2 do
  out[#out + 1] = 'consumer'
  out[#out + 1] = held[i]
  out[#out + 1] = held[i + 1]
  out[#out + 1] = rcall('ZSCORE', beatsKey, held[i]) or ''
  out[#out + 1] = rcall('HGET', groupKey, 'live:' .. held[i]) or ''
end
return out
