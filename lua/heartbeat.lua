--[[
  A worker's periodic call: records that this consumer is alive, extends the
  leases of the deliveries its handlers are running, and removes members of
  the group whose heartbeat lapsed, offering what they held again at once
  rather than after ack_wait (SPEC guarantee 7).

  Input:
    KEYS[1..15] the group layout (includes/group_keys.lua)
    ARGV[1..14] the group arguments (includes/group_args.lua)
    ARGV[15] heartbeat timeout, ms: a member silent for longer is dead
    ARGV[16], ARGV[17], ... seq1, count1, ... deliveries to extend
  Output:
    { new_deadline_ms, members_removed, returned, dead_lettered,
      status1, status2, ... } with "ok" or an error code per tag
  Errors:
    RQ_NOT_MEMBER  this consumer was itself removed (its leases are gone)
  Work: at most REAP_BATCH dead members per call.
]]
--@include read_now
--@include group_keys
--@include group_args
--@include delivery_state
--@include record
--@include bulk
--@include settle
--@include redelivery
--@include group_ops
--@include check_tag
--@include return_held
--@include extend_tags

local REAP_BATCH = 10 -- dead members removed per call

if rcall('HEXISTS', consumersKey, consumerName) == 0 then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumerName .. ' is not a member of group ' .. groupName)
end
rcall('ZADD', beatsKey, now, consumerName)
local deadline = now + ackWait
local statuses = extendTags(16, deadline)

local removed, returned, dead = 0, 0, 0
local silent = rcall('ZRANGEBYSCORE', beatsKey, '-inf', '(' .. (now - tonumber(ARGV[15])), 'LIMIT', 0, REAP_BATCH)
for _, member in ipairs(silent) do
  local r, d = returnHeld(member, false)
  removed, returned, dead = removed + 1, returned + r, dead + d
end
if removed > 0 then
  rcall('HINCRBY', groupKey, 'members_removed', removed)
end

local out = {deadline, removed, returned, dead}
for _, status in ipairs(statuses) do
  out[#out + 1] = status
end
return out
