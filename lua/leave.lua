--[[
  Removes a consumer from its group and returns every delivery it holds.
  A graceful leave puts them back at once, ready before new messages, with
  their delivery counts kept (SPEC guarantee 7). Removing a dead member counts
  the lost delivery as a failed attempt, so a message that kills its workers
  reaches max_deliveries and is dead-lettered.

  Input:
    KEYS[1..14] the group layout (includes/group_keys.lua)
    ARGV[1..14] the group arguments (includes/group_args.lua)
    ARGV[15] the consumer to remove (a worker may remove a dead peer)
    ARGV[16] "graceful" or "dead"
  Output:
    { returned, dead_lettered }
  Work: bounded by the group's in-flight set, at most max_inflight entries.
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

local leaving = ARGV[15]
local graceful = ARGV[16] == 'graceful'
local returned, dead = 0, 0
for _, s in ipairs(rcall('ZRANGE', leaseKey, 0, -1)) do
  local seq = tonumber(s)
  local d = readDelivery(dlvKey, seq)
  if d ~= nil and d.holder == leaving then
    if graceful then
      release(seq, d)
      writeDelivery(dlvKey, seq, d)
      requeue(seq, 0)
      returned = returned + 1
    elseif retryOrDeadLetter(seq, d, nil, 'consumer ' .. leaving .. ' died') == 'dead' then
      dead = dead + 1
    else
      returned = returned + 1
    end
  end
end
rcall('HDEL', consumersKey, leaving)
rcall('ZREM', beatsKey, leaving)
return {returned, dead}
