--[[
  A worker's periodic call: records that this consumer is alive, extends the
  leases of the deliveries its handlers are running, and removes members of
  the group whose liveness deadline passed (each judged by its own timeout),
  offering what they held again at once rather than after ack_wait
  (guarantee 7 in docs/guarantees.md). With sync, deliveries this consumer
  holds in Redis but does not know about (a fetch whose reply was lost) are
  handed back, uncounted.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (read where a record is a stub)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] this consumer's liveness timeout, ms
    ARGV[9] sync: "1" = ARGV[10..] lists every delivery the client knows
    ARGV[10], ARGV[11], ... seq1, count1, token1, ... deliveries to extend
  Output:
    { new_deadline_ms, members_removed, returned, dead_lettered, handed_back,
      incarnation, status1, status2, ... } with "ok" or an error code per
      tag (as extend.lua's); incarnation is the queue's (meta field "inc";
      "" when none)
  Errors:
    RQ_NOT_MEMBER  this consumer was itself removed (its leases are gone)
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse: read when
                   a dead member's deliveries are returned, before each is
                   changed, after this consumer's own beat and extensions
  Work: at most REAP_BATCH dead members per call; sync reads the in-flight
  set (at most max_inflight entries).
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@include beat
--@layout stream
--@include bulk
-- Call records (a stream log's first deliveries): made on their paths.
--@lazy callPaths call_state
--@end
--@include delivery_state
--@include requeue
--@include return_held
--@include extend_tags
--@include layout

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

local REAP_BATCH = 10 -- dead members removed per call

if rcall('HEXISTS', consumersKey, consumerName) == 0 then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumerName .. ' is not a member of group ' .. groupName)
end
rcall('HSET', groupKey, 'live:' .. consumerName, tonumber(ARGV[8]))
beat()
local deadline = now + ackWait
local statuses = extendTags(10, deadline)

local handedBack = 0
if ARGV[9] == '1' then
  local known = {}
  for i = 10, #ARGV, 3 do
    known[tonumber(ARGV[i])] = ARGV[i + 1] .. '.' .. ARGV[i + 2]
  end
  --@layout stream
  if callsKey then
    --@make callPaths
    splitUnknown(consumerName, known) -- per message, to be handed back below
  end
  --@end
  for _, s in ipairs(rcall('ZRANGE', leaseKey, 0, -1)) do
    local seq = tonumber(s)
    local d = s ~= SKIPLIST_PIN and readDelivery(dlvKey, seq)
    if d and d.holder == consumerName and known[seq] ~= d.count .. '.' .. d.token then
      -- Never seen by the client: not an attempt, so the count goes back.
      rcall('ZREM', leaseKey, seq)
      rcall('HINCRBY', consumersKey, consumerName, -1)
      d.holder = ''
      d.count = d.count - 1
      if d.count == 0 and d.past == '' then
        rcall('HDEL', dlvKey, seq)
      else
        writeDelivery(dlvKey, seq, d)
      end
      requeue(seq, 0)
      handedBack = handedBack + 1
    end
  end
end

local removed, returned, dead = 0, 0, 0
local silent = rcall('ZRANGEBYSCORE', beatsKey, '-inf', '(' .. now, 'LIMIT', 0, REAP_BATCH)
for _, member in ipairs(silent) do
  local r, d = returnHeld(member, false)
  removed, returned, dead = removed + 1, returned + r, dead + d
end
if removed > 0 then
  rcall('HINCRBY', groupKey, 'members_removed', removed)
end

local out = {deadline, removed, returned, dead, handedBack, rcall('HGET', metaKey, 'inc') or ''}
for _, status in ipairs(statuses) do
  out[#out + 1] = status
end
return out
