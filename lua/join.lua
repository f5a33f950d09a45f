--[[
  Adds a consumer to a group, creating the group when it does not exist. A
  new group starts at the oldest message still retained, so a queue's first
  group sees everything published before it.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] liveness timeout, ms: the member counts as dead when silent
      longer (optional: ack_wait)
  Output:
    { group_created (0/1), consumer_created (0/1) }
]]
--@include read_now
--@include group_keys
--@include group_args
--@include beat

local created = 0
if rcall('HEXISTS', floorsKey, groupName) == 0 then
  local start = rcall('HGET', metaKey, 'trimmed') or '0'
  rcall('HSET', floorsKey, groupName, start)
  rcall('HSET', groupKey, 'cursor', start)
  created = 1
end
local joined = rcall('HSETNX', consumersKey, consumerName, 0)
rcall('HSET', groupKey, 'live:' .. consumerName, tonumber(ARGV[8] or '') or ackWait)
beat()
return {created, joined}
