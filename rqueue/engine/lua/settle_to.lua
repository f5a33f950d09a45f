--[[
  Settles, for one group, every message with a seq up to a target that is
  not in flight: what its cursor has not read yet, what waits for a
  redelivery (due or delayed) and what a replay reopened. A delivery a
  consumer of the group holds stays with that consumer: its ack (or its
  lease running out) decides it, and the ack floor stops below it until
  then. Seqs the group settled already (under the floor, in the acked runs)
  are passed over. Counted as acked. A reader that takes messages by seq
  rather than by fetch (the Spark source) settles what it has read with it.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (sent with them, not read here)
    ARGV[1..7] the group arguments (includes/group_args.lua; the consumer
      is "")
    ARGV[8] target: the last seq to settle; a target above the queue's last
      seq stops at the last seq (a seq not published yet is never settled)
    ARGV[9] after: seqs up to this one were looked at by an earlier call of
      the same settle (0 at first); this call starts above it and above the
      ack floor
    ARGV[10] the most seqs to look at in this call (1..5000)
  Output:
    { settled, reached, more }: how many messages this call settled, the
    last seq it looked at (pass it as ARGV[9] of the next call), more = 1
    while reached is below the target (call again)
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  a number is not a whole number >= 0 (the limit 1..5000),
                     or the group does not exist
  Work: at most ARGV[10] seqs per call, and one look-up per acked run and
  per reopened seq among them.
]]
--@include group_keys
--@include group_names
--@include bulk
--@include delivery_state
--@include settle
--@include layout
--@layout stream
-- Call records (a stream log's first deliveries): split out where the
-- range meets them.
--@lazy callPaths call_state
--@end

local wrongLayout = checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end

local target = tonumber(ARGV[8])
local after = tonumber(ARGV[9])
local limit = tonumber(ARGV[10])
local function whole(n)
  return n ~= nil and n >= 0 and n == math.floor(n)
end
if not (whole(target) and whole(after) and whole(limit)) or limit < 1 or limit > 5000 then
  return redis.error_reply('RQ_BAD_ARGUMENT settle_to takes a target seq, a start seq and a limit of 1..5000')
end
local floorText = rcall('HGET', floorsKey, groupName)
if not floorText then
  return redis.error_reply('RQ_BAD_ARGUMENT the queue has no group ' .. groupName)
end
local last = tonumber(rcall('HGET', metaKey, 'seq') or '0')
if target > last then
  target = last
end
local from = math.max(after, floorText + 0) + 1
local upto = math.min(target, from + limit - 1)
local seqs = {}
--@layout stream
if upto >= from and callsKey then
  --@make callPaths
  splitRange(from, upto) -- their deliveries, per message: held, so they stay (includes/call_state.lua)
end
--@end
if upto >= from then
  -- The acked runs that overlap from..upto: their seqs are settled already.
  local skip = {}
  local runs = rcall('ZRANGEBYSCORE', ackedKey, string.format('%d', from), '+inf', 'WITHSCORES')
  for i = 1, #runs, 2 do
    local first = runs[i] + 0
    if first > upto then
      break
    end
    for s = math.max(first, from), math.min(runs[i + 1] + 0, upto) do
      skip[s] = true
    end
  end
  local candidates = {}
  for s = from, upto do
    if not skip[s] then
      candidates[#candidates + 1] = s
    end
  end
  -- A delivery state exists exactly while a message is delivered or waits
  -- for a redelivery; a message without one is settled at once.
  local states = {}
  if #candidates > 0 and rcall('EXISTS', dlvKey) == 1 then
    states = rcall('HMGET', dlvKey, unpack(candidates))
  end
  local waiting = {}
  for i, s in ipairs(candidates) do
    local raw = states[i]
    if not raw then
      seqs[#seqs + 1] = s
    else
      local d, corrupt = parseDelivery(s, raw)
      -- A state that does not parse is left to fetch, which dead-letters it.
      if not corrupt and d.holder == '' then
        waiting[#waiting + 1] = s
        seqs[#seqs + 1] = s
      end
    end
  end
  if #waiting > 0 then
    bulk('ZREM', readyKey, waiting)
    bulk('ZREM', delayKey, waiting)
    bulk('HDEL', dlvKey, waiting)
  end
  local cursor = tonumber(rcall('HGET', groupKey, 'cursor') or '0')
  if cursor < upto then
    rcall('HSET', groupKey, 'cursor', string.format('%d', upto))
  end
else
  upto = math.max(after, target)
end
-- Seqs reopened by a replay at or below the ack floor (and the target),
-- waiting to be delivered again: settled with the first call.
if after == 0 then
  local bound = string.format('%d', math.min(floorText + 0, target))
  local reopened = rcall('ZRANGEBYSCORE', reopenKey, '-inf', bound, 'LIMIT', '0', string.format('%d', limit))
  for _, s in ipairs(reopened) do
    local d, corrupt = parseDelivery(s, rcall('HGET', dlvKey, s))
    if d == nil or (not corrupt and d.holder == '') then
      rcall('ZREM', readyKey, s)
      rcall('ZREM', delayKey, s)
      rcall('HDEL', dlvKey, s)
      seqs[#seqs + 1] = s + 0
    end
  end
end
settleMany(seqs)
if #seqs > 0 then
  rcall('HINCRBY', groupKey, 'acked', #seqs)
end
local more = 0
if upto < target then
  more = 1
end
return {#seqs, upto, more}
