--[[
  Acknowledges deliveries of one consumer. A tag is a (seq, count) pair: the
  count-th delivery of seq in this group.

  A tag is accepted when it is the current delivery held by this consumer,
  when its lease ran out but nobody else got the message yet, or when it is an
  earlier delivery of a message that is still unsettled (the work was done:
  a late ack completes the message and the newer delivery becomes stale).

  Input:
    KEYS[1..14] the group layout (includes/group_keys.lua)
    ARGV[1..14] the group arguments (includes/group_args.lua)
    ARGV[15] strict: "1" = all tags or none, "0" = settle what is valid
    ARGV[16], ARGV[17], ... seq1, count1, seq2, count2, ...
  Output:
    one status per tag, in order: "ok", or the error code of that tag
  Errors (strict only; nothing is changed):
    RQ_ACKED <seq>.<count>     the group has already settled that message
    RQ_UNKNOWN_TAG <seq>.<count> no such delivery was ever made
    RQ_NOT_HELD <seq>.<count>  the delivery belongs to another consumer
]]
--@include read_now
--@include group_keys
--@include group_args
--@include delivery_state
--@include record
--@include settle
--@include redelivery
--@include group_ops
--@include check_tag

local strict = ARGV[15] == '1'

local statuses = {}
for i = 16, #ARGV, 2 do
  local seq, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local code, d = checkTag(seq, count, true)
  if code ~= 'ok' and strict then
    return redis.error_reply(code .. ' ' .. seq .. '.' .. count)
  end
  statuses[#statuses + 1] = {seq, code, d}
end
local result = {}
local acked = 0
for i, st in ipairs(statuses) do
  if st[2] == 'ok' then
    -- A tag listed twice in one call finds the message settled the second time.
    if rcall('HEXISTS', dlvKey, st[1]) == 1 then
      complete(st[1], readDelivery(dlvKey, st[1]))
      acked = acked + 1
      result[i] = 'ok'
    else
      result[i] = 'RQ_ACKED'
    end
  else
    result[i] = st[2]
  end
end
if acked > 0 then
  rcall('HINCRBY', groupKey, 'acked', acked)
end
return result
