--[[
  Adds a consumer to a group, creating the group when it does not exist. A
  new group starts at the oldest message still retained, so a queue's first
  group sees everything published before it. The group records the last
  seq at its creation (since): a record missing above it is damage, one
  missing below it may have been settled by every group before this one.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (sent with them, not read here)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] liveness timeout, ms: the member counts as dead when silent
      longer (optional: ack_wait)
    ARGV[9] an incarnation id for the queue, drawn at random by the client:
      stored in meta field "inc" when the queue has none (optional: none is
      stored)
  Output:
    { group_created (0/1), consumer_created (0/1), incarnation } the
    queue's incarnation ("" when it has none): a client that sees it change
    knows Redis lost the queue's state
  Errors (nothing is changed):
    RQ_PARTITIONED <layout>  the queue was made a partitioned queue (meta
      field "partitioned", set by partition.lua): groups join its partitions
    RQ_DELETING <meta key>  the queue is being deleted (meta field
      "deleting", rqueue.engine.store.delete_queue): a join now would write
      a group's state after the delete read which groups to delete, and it
      would outlive the queue

  An acked key that is a set, not runs (includes/acked_runs.lua), is made
  runs here, before any other script meets it (docs/upgrading.md).
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@include beat
--@include layout
--@include group_generation
--@lazy ackedRuns acked_runs

local inc, partitioned, layout, seq, deleting =
  unpack(rcall('HMGET', metaKey, 'inc', 'partitioned', 'layout', 'seq', 'deleting'))
if partitioned then
  return redis.error_reply('RQ_PARTITIONED ' .. partitioned)
end
if deleting then
  return redis.error_reply('RQ_DELETING ' .. metaKey)
end
-- A group made by a client of the other layout would hold the trim back
-- for ever (its floor never moves): refused before any write.
local wrongLayout = layoutError(metaKey, msgsKey, layout, seq)
if wrongLayout then
  return wrongLayout
end
if not inc and string.find(ARGV[9] or '', '^%l[%l%d]*$') and #ARGV[9] <= 32 then
  inc = ARGV[9]
  rcall('HSET', metaKey, 'inc', inc)
end
local created = 0
if rcall('HEXISTS', floorsKey, groupName) == 0 then
  -- The registry (the floors hash) does not name the group, but its hash
  -- is there: the floors hash, or its field, was deleted. Making the group
  -- again over that state would hand out again what it settled, and what
  -- its consumers hold. Nothing but damage leaves the hash alone: a group
  -- delete and a queue delete take it with the floor.
  if rcall('EXISTS', groupKey) == 1 then
    return redis.error_reply('RQ_CORRUPT ' .. floorsKey .. ' has no field ' .. groupName .. ' (the group\'s ack '
      .. 'floor and its entry in the registry of groups), while ' .. groupKey .. ' holds the state of that group: '
      .. 'made again, it would hand out again what the group settled. Set the field back to the group\'s floor '
      .. '(HSET), or delete the group\'s keys to start it afresh')
  end
  local start = rcall('HGET', metaKey, 'trimmed') or '0'
  rcall('HSET', floorsKey, groupName, start)
  newGeneration() -- first field of the hash (includes/group_generation.lua)
  rcall('HSET', groupKey, 'cursor', start)
  -- The last seq now: a record above it that the group's fetch finds
  -- missing was deleted while the group needed it, not before it existed.
  rcall('HSET', groupKey, 'since', rcall('HGET', metaKey, 'seq') or '0')
  created = 1
end
-- ZCARD refuses a set (WRONGTYPE); pcall keeps that from ending the call,
-- and TYPE would need one more command in every deployment's ACL.
local probe = redis.pcall('ZCARD', ackedKey)
if type(probe) == 'table' and probe.err then
  --@make ackedRuns
  runsFromSet()
end
local joined = rcall('HSETNX', consumersKey, consumerName, 0)
rcall('HSET', groupKey, 'live:' .. consumerName, tonumber(ARGV[8] or '') or ackWait)
beat()
return {created, joined, inc or ''}
