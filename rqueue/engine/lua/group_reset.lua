--[[
  Moves a group to a position (includes/group_position.lua), back (the
  group is handed again what it settled: an operator's explicit choice,
  guarantee 2 does not cover it) or forward (it counts what it skips as
  settled). Everything the group has in flight or waiting is taken back
  (includes/group_clear.lua), so no settle of a delivery from before the
  reset changes the group's new state; by default a group with deliveries
  in flight is refused. The reset is recorded as a "reset" event.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the position: "first", "last", "seq" or "time"
    ARGV[9] its value: a seq, or a time in ms since the epoch
    ARGV[10] "1": reset even with deliveries in flight (their settles fail)
  Output:
    { previous floor, floor, deliveries taken back from consumers }
  Errors (nothing is changed):
    RQ_NO_GROUP     the group does not exist
    RQ_GROUP_BUSY   deliveries are in flight and ARGV[10] is not "1"
    RQ_POSITION     a position that is not stored or not valid
  Work: the group's in-flight and waiting sets, read whole.
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@include group_position
--@layout stream
--@include bulk
-- Call records (a stream log's first deliveries): split out before a clear.
--@lazy callPaths call_state
--@end
--@include group_clear
--@include record_event
--@include layout
--@include group_generation

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

local previous = rcall('HGET', floorsKey, groupName)
if not previous then
  return redis.error_reply('RQ_NO_GROUP group ' .. groupName .. ' does not exist')
end
local floor = positionFloor(ARGV[8], ARGV[9])
local held = deliveriesOut()
if held > 0 and ARGV[10] ~= '1' then
  return redis.error_reply('RQ_GROUP_BUSY ' .. held .. ' group ' .. groupName .. ' has ' .. held
    .. ' deliveries in flight')
end
local cancelled = clearGroup()
local floorText = string.format('%d', floor)
rcall('HSET', floorsKey, groupName, floorText)
rcall('HSET', groupKey, 'cursor', floorText, 'cursor_checked', floorText,
  'since', rcall('HGET', metaKey, 'seq') or '0')
-- A floor moved back is the operator's choice, not acks Redis lost: a new
-- generation tells the group's consumers so.
newGeneration()
recordEvent('reset', floorText, 'from ' .. previous .. ', ' .. cancelled .. ' in flight taken back')
return {tonumber(previous), floor, cancelled}
