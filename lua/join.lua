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

  A group written by rqueue before its acks above the floor were runs
  (includes/acked_runs.lua) kept them as a set, one member per seq; the
  first consumer that joins makes them runs (once; the set's size is the
  work). Consumers of that older version must be stopped first: they
  would write the set again, which the newer scripts cannot read.
]]
--@include read_now
--@include group_keys
--@include group_args
--@include beat
--@include bulk

local created = 0
if rcall('HEXISTS', floorsKey, groupName) == 0 then
  local start = rcall('HGET', metaKey, 'trimmed') or '0'
  rcall('HSET', floorsKey, groupName, start)
  rcall('HSET', groupKey, 'cursor', start)
  created = 1
end
-- ZCARD refuses a set (WRONGTYPE); pcall keeps that from ending the call,
-- and TYPE would need one more command in every deployment's ACL.
local probe = redis.pcall('ZCARD', ackedKey)
if type(probe) == 'table' and probe.err then
  local seqs = rcall('SMEMBERS', ackedKey)
  for i, s in ipairs(seqs) do
    seqs[i] = s + 0
  end
  table.sort(seqs)
  local runs = {} -- last, first of each run: ZADD's score, member
  local i = 1
  while i <= #seqs do
    local j = i
    while j < #seqs and seqs[j + 1] == seqs[j] + 1 do
      j = j + 1
    end
    runs[#runs + 1] = string.format('%d', seqs[j])
    runs[#runs + 1] = string.format('%d', seqs[i])
    i = j + 1
  end
  rcall('DEL', ackedKey)
  bulk('ZADD', ackedKey, runs)
  rcall('HSET', groupKey, ACKED_ABOVE, string.format('%d', #seqs))
end
local joined = rcall('HSETNX', consumersKey, consumerName, 0)
rcall('HSET', groupKey, 'live:' .. consumerName, tonumber(ARGV[8] or '') or ackWait)
beat()
return {created, joined}
