--[[
  Creates a group at a position (includes/group_position.lua): "first" (the
  oldest message stored, where join.lua starts a group it creates), "last"
  (only what is published from now on), "seq" N or "time" T.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
    ARGV[1..7] the group arguments (includes/group_args.lua); ARGV[2], the
      consumer, is not read
    ARGV[8] the position: "first", "last", "seq" or "time"
    ARGV[9] its value: a seq, or a time in ms since the epoch ("" for
      first and last)
  Output:
    { floor, last } the ack floor the group starts at (it is handed the
    seqs above it) and the last seq published
  Errors (nothing is changed):
    RQ_GROUP_EXISTS  the group exists
    RQ_POSITION      a position that is not stored or not valid
    RQ_DELETING <meta key>  the queue is being deleted (join.lua says why)
]]
--@include group_keys
--@include group_names
--@include group_args
--@include group_position
--@include layout
--@include group_generation

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

if rcall('HEXISTS', metaKey, 'deleting') == 1 then
  return redis.error_reply('RQ_DELETING ' .. metaKey)
end
if rcall('HEXISTS', floorsKey, groupName) == 1 then
  return redis.error_reply('RQ_GROUP_EXISTS group ' .. groupName .. ' exists (reset it to move it)')
end
local floor = positionFloor(ARGV[8], ARGV[9])
local last = rcall('HGET', metaKey, 'seq') or '0'
local floorText = string.format('%d', floor)
rcall('HSET', floorsKey, groupName, floorText)
newGeneration() -- first field of the hash (includes/group_generation.lua)
rcall('HSET', groupKey, 'cursor', floorText, 'cursor_checked', floorText, 'since', last)
return {floor, tonumber(last)}
