--[[
  Deletes a group: its ack floor, cursor, counters and members, and
  everything it had in flight or waiting (includes/group_clear.lua). Records
  only it still needed are deleted by the trim step (includes/retention.lua);
  a queue left without groups keeps what is stored. In a stream log, up to
  1,000 side records at or below the trim point go with their priority log
  entries (includes/side_sweep.lua): no fetch may come to delete them. The
  group's dead letters stay in the dead-letter queue. Recorded as a
  "group-deleted" event.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] "1": delete even with deliveries in flight (their settles fail)
  Output:
    { deliveries taken back from consumers }
  Errors (nothing is changed):
    RQ_NO_GROUP     the group does not exist
    RQ_GROUP_BUSY   deliveries are in flight and ARGV[8] is not "1"
  Work: the group's in-flight and waiting sets, read whole.
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@layout stream
--@include bulk
-- Call records (a stream log's first deliveries): split out before a clear.
--@lazy callPaths call_state
--@end
--@include group_clear
--@include record_event
--@include layout
--@include side_sweep

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

local floor = rcall('HGET', floorsKey, groupName)
if not floor then
  return redis.error_reply('RQ_NO_GROUP group ' .. groupName .. ' does not exist')
end
local held = deliveriesOut()
if held > 0 and ARGV[8] ~= '1' then
  return redis.error_reply('RQ_GROUP_BUSY ' .. held .. ' group ' .. groupName .. ' has ' .. held
    .. ' deliveries in flight')
end
local cancelled = clearGroup()
rcall('HDEL', floorsKey, groupName)
rcall('DEL', groupKey, leaseKey, readyKey, delayKey, dlvKey, ackedKey, consumersKey, reopenKey, beatsKey, rateKey)
recordEvent('group-deleted', floor, cancelled .. ' in flight taken back')
if sideKey then
  sweepSide(metaKey, prioKey, sideKey)
end
return {cancelled}
